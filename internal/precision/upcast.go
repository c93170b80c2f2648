package precision

import (
	"regexp"
	"strings"

	"fp16audit/internal/onnx"
)

// Under model.half(), a normalization module that squares its input in
// float32 whatever its dtype (Hugging Face's RMSNorms:
// hidden_states.to(torch.float32) ... self.weight *
// hidden_states.to(input_dtype)) computes in float32 and hands on a value
// of its 16-bit weight's dtype. An export traced in float32 cannot hold
// those casts: torch.export drops a .to() that changes nothing, so the
// dynamo exporter writes the norm's Pow, ReduceMean and Mul as if they
// computed in the input's dtype. (The TorchScript exporter writes the
// casts, and the Cast rules read them.) The module is told apart by what
// the dynamo exporter records on its nodes:
//
//   - its class (pkg.torch.onnx.class_hierarchy) is a Hugging Face RMSNorm
//     (transformers.*RMSNorm, T5LayerNorm), every one of which upcasts; or
//   - its class is named like a normalization (…Norm) and a line of its
//     source (pkg.torch.onnx.stack_trace) casts to float32 (.float(),
//     torch.float32): a hand-written norm as T5's.
//
// Under autocast the same modules need no rule: the pow, mean and rsqrt
// they compute are on autocast's fp32 list or promote with them, and
// their float32 weight keeps the output in float32.

// fp32Cast matches a line of Python that casts to float32.
var fp32Cast = regexp.MustCompile(`\.float\(\)|torch\.float(32)?\b`)

// upcastNorms returns, for each node of g that belongs to a normalization
// module upcasting its input to float32 (see above), that module's path.
func upcastNorms(g *onnx.GraphProto) map[int]string {
	type module struct {
		class string
		cast  bool
		nodes []int
	}
	mods := map[string]*module{}
	for i, n := range g.GetNode() {
		if !onnx.ClassMentions(n, "Norm") {
			continue // most nodes: their metadata is not read further
		}
		class := onnx.ModuleClass(n)
		if !strings.HasSuffix(class, "Norm") {
			continue
		}
		path := onnx.ModulePath(n)
		if path == "" {
			continue
		}
		m := mods[path]
		if m == nil {
			m = &module{class: class}
			mods[path] = m
		}
		m.nodes = append(m.nodes, i)
		m.cast = m.cast || fp32Cast.MatchString(onnx.SourceLine(n))
	}
	out := map[int]string{}
	for path, m := range mods {
		if !m.cast && !hfUpcastingNorm(m.class) {
			continue
		}
		for _, i := range m.nodes {
			out[i] = path
		}
	}
	return out
}

// hfUpcastingNorm reports whether class is one of Hugging Face's
// normalizations that compute in float32 whatever their input's dtype:
// the RMSNorms (Llama's, Qwen's, Mistral's, Gemma's …) and T5's.
func hfUpcastingNorm(class string) bool {
	if !strings.HasPrefix(class, "transformers.") {
		return false
	}
	base := class[strings.LastIndexByte(class, '.')+1:]
	return strings.HasSuffix(base, "RMSNorm") || base == "T5LayerNorm"
}

// upcast applies the rule to node i of an upcasting norm: it computes in
// float32; an output read outside the module (or a graph output) is
// rounded to the policy's parameter precision, the weight's dtype the
// module casts back to; one read only inside stays float32.
func (s *assigner) upcast(i int) {
	module := s.upcasts[i]
	n := s.g.Node[i]
	if s.a.Node[i] == NotFloat || n.OpType == "Cast" || n.OpType == "CastLike" {
		return // an explicit cast is the model's own, as everywhere
	}
	s.computeFP32(i)
	for _, name := range n.Output {
		if name != "" && s.a.Value[name] != NotFloat && s.leaves(name, module) {
			s.a.Value[name] = s.p.Params
			s.a.Why[name] = ReasonHalfPolicy
		}
	}
}

// leaves reports whether value name is read outside module, or is a
// graph output.
func (s *assigner) leaves(name, module string) bool {
	for _, o := range s.g.Output {
		if o.GetName() == name {
			return true
		}
	}
	for _, u := range s.consumers[name] {
		if m, ok := s.upcasts[u.node]; !ok || m != module {
			return true
		}
	}
	return false
}
