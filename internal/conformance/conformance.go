// Package conformance runs fp16audit over the ONNX backend test models (the
// node, simple, pytorch-converted and pytorch-operator suites that Debian's
// libonnx-testdata installs) and classifies every outcome: the audit
// completed and its fp32 pass reproduced the reference outputs, ONNX Runtime
// cannot run the model at all, the model lies outside what fp16audit audits,
// or fp16audit failed. The sweep and its table live here; the tests in this
// package hold the counts to the committed baseline.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"fp16audit/internal/audit"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/rewrite"
	"fp16audit/internal/tensor"
)

// DefaultRoot is where Debian's libonnx-testdata installs the test models.
const DefaultRoot = "/usr/share/libonnx-testdata/data"

// Suites are the folders of the backend test data the sweep covers. The
// "real" suite is left out: its models (ResNet-50, VGG-19, …) are
// downloaded by the ONNX test runner and not shipped in the package.
var Suites = []string{"node", "simple", "pytorch-converted", "pytorch-operator"}

// Default tolerances of the ONNX backend test runner (numpy's
// assert_allclose with rtol=1e-3, atol=1e-7).
const (
	RTol = 1e-3
	ATol = 1e-7
)

// Outcome classifies one test model.
type Outcome string

// Outcomes, from best to worst. Matched and Deviates are the completed
// audits; Unsupported and OutOfScope are clean, explained refusals; Failed
// is fp16audit's fault and must stay at zero.
const (
	// Matched: the audit completed (fp32 and every emulated pass ran) and
	// the fp32 pass reproduced the reference outputs.
	Matched Outcome = "matched"
	// Deviates: the audit completed; the fp32 pass differs from the
	// reference outputs exactly as a plain ONNX Runtime run of the
	// unmodified model does, so the difference is ONNX Runtime's.
	Deviates Outcome = "runtime-deviates"
	// Unsupported: ONNX Runtime cannot run the unmodified model either (no
	// kernel, not implemented, a type its CPU provider lacks, or an output
	// onnxruntime_go cannot read); fp16audit says so and exits 3.
	Unsupported Outcome = "unsupported"
	// OutOfScope: the model's inputs are not tensors fp16audit can feed
	// (sequences, optionals, maps, strings); fp16audit refuses the batch
	// with a message naming the file and exits 2.
	OutOfScope Outcome = "out-of-scope"
	// Failed: anything else — a panic, an unclassified error, a rewrite
	// ONNX Runtime rejects although it runs the original, or fp32 outputs
	// that differ where ONNX Runtime's own run matches.
	Failed Outcome = "failed"
)

// rank orders outcomes from best (0) to worst.
var rank = map[Outcome]int{Matched: 0, Deviates: 1, OutOfScope: 2, Unsupported: 2, Failed: 3}

// Worse reports whether o is a worse outcome than base.
func (o Outcome) Worse(base Outcome) bool { return rank[o] > rank[base] }

// Completed reports whether the audit ran to its report.
func (o Outcome) Completed() bool { return o == Matched || o == Deviates }

// Case is one test model.
type Case struct {
	// Name is "suite/test_name".
	Name string
	// Dir holds model.onnx and the test_data_set_* folders.
	Dir string
}

// Result is the outcome of one case.
type Result struct {
	Case    string  `json:"case"`
	Outcome Outcome `json:"outcome"`
	// Reason is a short, stable class of the outcome, such as "no kernel"
	// or "sequence input"; Detail is the first line of the message.
	Reason string  `json:"reason,omitempty"`
	Detail string  `json:"-"`
	Secs   float64 `json:"-"`
}

// Cases lists the test models of the suites under root, in suite order and
// then by name.
func Cases(root string) ([]Case, error) {
	var cases []Case
	for _, s := range Suites {
		entries, err := os.ReadDir(filepath.Join(root, s))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			dir := filepath.Join(root, s, e.Name())
			if _, err := os.Stat(filepath.Join(dir, "model.onnx")); e.IsDir() && err == nil {
				cases = append(cases, Case{Name: s + "/" + e.Name(), Dir: dir})
			}
		}
	}
	return cases, nil
}

// Options tunes a sweep.
type Options struct {
	// Timeout bounds one case; ONNX Runtime cannot be interrupted inside a
	// run, so it only stops the audit between passes.
	Timeout time.Duration
	// NoFixes skips the fix reruns of the audit.
	NoFixes bool
}

// RunCase audits one test model the way `fp16audit run DIR/model.onnx -i DIR`
// does, with one session thread, and classifies the outcome. It never
// panics: a panic anywhere is a Failed result with its stack in Detail.
func RunCase(c Case, opt Options) (res Result) {
	start := time.Now()
	res.Case = c.Name
	defer func() {
		if p := recover(); p != nil {
			res.Outcome, res.Reason = Failed, "panic"
			res.Detail = fmt.Sprintf("panic: %v\n%s", p, debug.Stack())
		}
		res.Secs = time.Since(start).Seconds()
	}()
	ctx := context.Background()
	if opt.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opt.Timeout)
		defer cancel()
	}
	model := filepath.Join(c.Dir, "model.onnx")
	_, err := audit.Run(ctx, audit.Config{ModelPath: model, Inputs: []string{c.Dir}, Threads: 1, NoFixes: opt.NoFixes})
	if err != nil {
		res.Outcome, res.Reason, res.Detail = classifyError(ctx, c, err)
		return res
	}
	res.Outcome, res.Reason, res.Detail = checkOutputs(c)
	return res
}

// classifyError sorts an audit error into an outcome.
func classifyError(ctx context.Context, c Case, err error) (Outcome, string, string) {
	detail := firstLine(err.Error())
	switch {
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return Failed, "timeout", detail
	case audit.IsUsage(err):
		if r := outOfScope(c); r != "" {
			return OutOfScope, r, detail
		}
		if errors.Is(err, batch.ErrEmpty) {
			// A zero-size test tensor: an audit refuses to pass data it
			// cannot observe.
			return OutOfScope, "empty input", detail
		}
		// Test data the runtime refuses too (a shape that contradicts
		// the model) is the test's problem, not fp16audit's.
		if plainErr := runPlain(c, nil); plainErr != nil {
			return Unsupported, runtimeReason(plainErr), firstLine(plainErr.Error())
		}
		return Failed, "input error", detail
	}
	var me *audit.ModelError
	if !errors.As(err, &me) {
		return Failed, "error", detail
	}
	var le *onnx.LoadError
	if errors.As(err, &le) {
		return Failed, "load error", detail
	}
	// ONNX Runtime refused to run fp16audit's rewrite of the model. That is
	// only the runtime's limitation when it refuses the original too.
	plainErr := runPlain(c, nil)
	if plainErr == nil {
		return Failed, "rewrite rejected", detail
	}
	return Unsupported, runtimeReason(plainErr), firstLine(plainErr.Error())
}

// outOfScope names why a model's inputs are outside what fp16audit feeds,
// from the model and its test data, or returns "".
func outOfScope(c Case) string {
	m, err := onnx.Load(filepath.Join(c.Dir, "model.onnx"))
	if err != nil {
		return ""
	}
	ins := m.Index.GraphInputs()
	if len(ins) == 0 {
		return "model without inputs"
	}
	for _, vi := range ins {
		tt := vi.GetType().GetTensorType()
		switch {
		case tt == nil:
			return "non-tensor input (sequence, optional or map)"
		case tt.GetElemType() == int32(onnx.TensorProto_STRING):
			return "string input"
		}
	}
	for _, vi := range m.Proto.Graph.Output {
		if vi.GetType().GetTensorType() == nil {
			return "non-tensor output (sequence, optional or map)"
		}
	}
	if sets, err := dataSets(c.Dir); err == nil {
		if inputs, _, err := batch.ReadTestDataSet(sets[0]); err == nil && len(inputs) == len(ins) {
			for i, vi := range ins {
				if vi.GetType().GetTensorType().GetElemType() == int32(onnx.TensorProto_BFLOAT16) && inputs[i].DType == tensor.Uint16 {
					return "bfloat16 test data stored as uint16"
				}
			}
		}
	}
	return ""
}

// runtimeReason classifies an error of ONNX Runtime (or onnxruntime_go).
func runtimeReason(err error) string {
	msg := err.Error()
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
	switch {
	case has("No Op registered", "Could not find an implementation", "is not a registered function/op"):
		return "no kernel"
	case has("NOT_IMPLEMENTED", "not implemented", "Not implemented", "are not supported"):
		return "not implemented"
	case has("read outputs", "unsupported output value", "is not supported", "not supported", "Unsupported", "unsupported"):
		return "type not supported"
	case has("opset", "Opset"):
		return "opset not supported"
	case has("INVALID_GRAPH", "INVALID_ARGUMENT", "Type Error", "ShapeInferenceError", "shape inference"):
		return "model rejected"
	case has("RUNTIME_EXCEPTION", "FAIL"):
		return "runtime error"
	}
	return "other runtime error"
}

// runPlain runs the unmodified model on the first test data set through
// ONNX Runtime, for telling the runtime's limits and deviations apart from
// fp16audit's. When outs is not nil it receives the graph's outputs.
func runPlain(c Case, outs *[]*tensor.Tensor) error {
	m, err := onnx.Load(filepath.Join(c.Dir, "model.onnx"))
	if err != nil {
		return err
	}
	return runModel(m.Proto, m, c, graphOutputs(m.Proto), outs)
}

func graphOutputs(mp *onnx.ModelProto) []string {
	var names []string
	for _, vi := range mp.Graph.Output {
		names = append(names, vi.GetName())
	}
	return names
}

// runModel runs mp (m's model or a rewrite of it) on the first test data
// set, asking for outNames. When outs is not nil it receives the outputs
// named by m's own graph outputs, in that order.
func runModel(mp *onnx.ModelProto, m *onnx.Model, c Case, outNames []string, outs *[]*tensor.Tensor) error {
	sets, err := dataSets(c.Dir)
	if err != nil {
		return err
	}
	inputs, _, err := batch.ReadTestDataSet(sets[0])
	if err != nil {
		return err
	}
	var inNames []string
	for _, vi := range m.Index.GraphInputs() {
		inNames = append(inNames, vi.GetName())
	}
	if len(inNames) != len(inputs) {
		return fmt.Errorf("%d inputs for %d test data files", len(inNames), len(inputs))
	}
	data, err := onnx.Marshal(mp)
	if err != nil {
		return err
	}
	sess, err := onnxrt.NewSession(data, inNames, outNames, onnxrt.SessionOptions{Threads: 1, ExternalDataDir: m.Dir, Optimization: audit.Optimization})
	if err != nil {
		return err
	}
	defer sess.Close()
	res, err := sess.Run(inputs)
	if err != nil {
		return err
	}
	if outs != nil {
		// The outputs are Go memory, but copy them so that nothing
		// depends on what Close frees.
		for _, t := range res[:len(m.Proto.Graph.Output)] {
			*outs = append(*outs, &tensor.Tensor{Name: t.Name, DType: t.DType, Shape: slices.Clone(t.Shape), Data: slices.Clone(t.Data)})
		}
	}
	return nil
}

// dataSets lists the test_data_set_* folders of dir in order.
func dataSets(dir string) ([]string, error) {
	sets, err := filepath.Glob(filepath.Join(dir, "test_data_set_*"))
	if err != nil {
		return nil, err
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("%s: no test_data_set_* folder", dir)
	}
	slices.Sort(sets)
	return sets, nil
}

// fp32Pass runs what the audit's fp32 pass runs — the upcast model with
// every float node output marked as an extra graph output — on the first
// data set, and returns the model's own outputs.
func fp32Pass(c Case) ([]*tensor.Tensor, error) {
	m, err := onnx.Load(filepath.Join(c.Dir, "model.onnx"))
	if err != nil {
		return nil, err
	}
	up, _, err := rewrite.Upcast(m.Proto, m.Dir)
	if err != nil {
		return nil, err
	}
	upIdx, err := onnx.NewIndex(up.Graph)
	if err != nil {
		return nil, err
	}
	var names, typed []string
	for _, ni := range m.Index.Order() {
		n := m.Proto.Graph.Node[ni]
		if n.OpType == "Constant" && onnx.IsDefaultDomain(n.Domain) {
			continue
		}
		for _, o := range n.Output {
			if !upIdx.Tensor(o) {
				continue // a sequence's tensors are observed where they are taken out
			}
			switch upIdx.ElemType(o) {
			case int32(onnx.TensorProto_FLOAT), int32(onnx.TensorProto_DOUBLE), int32(onnx.TensorProto_FLOAT16), int32(onnx.TensorProto_BFLOAT16):
				names = append(names, o)
				typed = append(typed, o)
			case 0:
				if o != "" {
					names = append(names, o)
				}
			}
		}
	}
	var outs []*tensor.Tensor
	for _, obsNames := range [][]string{names, typed} {
		inst, obs := rewrite.Instrument(up, obsNames, upIdx.ElemType)
		outNames := graphOutputs(up)
		isOut := map[string]bool{}
		for _, o := range outNames {
			isOut[o] = true
		}
		for _, o := range obs {
			if !isOut[o.Output] {
				outNames = append(outNames, o.Output)
			}
		}
		outs = nil
		if err = runModel(inst, m, c, outNames, &outs); err == nil {
			return outs, nil
		}
	}
	return nil, err
}

// checkOutputs compares the fp32 pass's outputs with the reference outputs
// of the first data set.
func checkOutputs(c Case) (Outcome, string, string) {
	sets, err := dataSets(c.Dir)
	if err != nil {
		return Failed, "no test data", err.Error()
	}
	_, want, err := batch.ReadTestDataSet(sets[0])
	if err != nil {
		if r := outOfScope(c); r != "" {
			// Completed, but the reference holds sequences or optionals.
			return Deviates, "reference not comparable: " + r, firstLine(err.Error())
		}
		return Failed, "reference unreadable", firstLine(err.Error())
	}
	m, err := onnx.Load(filepath.Join(c.Dir, "model.onnx"))
	if err != nil {
		return Failed, "load error", firstLine(err.Error())
	}
	for i, vi := range m.Proto.Graph.Output {
		// The backend tests store bfloat16 data as uint16 (numpy has no
		// bfloat16).
		if i < len(want) && want[i].DType == tensor.Uint16 && vi.GetType().GetTensorType().GetElemType() == int32(onnx.TensorProto_BFLOAT16) {
			want[i].DType = tensor.BFloat16
		}
	}
	got, err := fp32Pass(c)
	if err != nil {
		return Failed, "fp32 pass", firstLine(err.Error())
	}
	diff := compareAll(got, want)
	if diff == "" {
		return Matched, "", ""
	}
	if op := randomOp(m.Proto.Graph); op != "" {
		return Deviates, "random op " + op, diff
	}
	// The fp32 pass differs from the reference. If ONNX Runtime's plain run
	// of the unmodified model differs from it by as much, the deviation is
	// the runtime's.
	var plain []*tensor.Tensor
	if err := runPlain(c, &plain); err != nil {
		return Failed, "output mismatch", diff
	}
	if compareAll(plain, want) != "" && compareAll(got, plain) == "" {
		return Deviates, "runtime differs from reference", diff
	}
	return Failed, "output mismatch", diff
}

// randomOp returns the first random op of g, or "".
func randomOp(g *onnx.GraphProto) string {
	for _, n := range g.Node {
		if ops.Random(n.Domain, n.OpType) {
			return n.OpType
		}
	}
	return ""
}

// compareAll compares outputs pairwise and describes the first difference,
// or returns "".
func compareAll(got, want []*tensor.Tensor) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d outputs, reference has %d", len(got), len(want))
	}
	for i := range got {
		if d := Compare(got[i], want[i]); d != "" {
			return fmt.Sprintf("output %d: %s", i, d)
		}
	}
	return ""
}

// Compare checks got against want as the ONNX backend test runner does:
// the same shape; integers and booleans equal; floats within
// |got-want| <= ATol + RTol*|want|, NaN matching NaN and infinities matching
// in sign. A 16-bit float reference is compared with the tolerance of its
// type (two units in the last place), since the fp32 pass computes what the
// reference rounded. It returns "" or a description of the first
// difference.
func Compare(got, want *tensor.Tensor) string {
	if !slices.Equal(got.Shape, want.Shape) && tensor.NumElements(got.Shape) != tensor.NumElements(want.Shape) {
		return fmt.Sprintf("shape %s, reference %s", tensor.ShapeString(got.Shape), tensor.ShapeString(want.Shape))
	}
	if !slices.Equal(got.Shape, want.Shape) && (len(got.Shape) > 0 || len(want.Shape) > 0) {
		return fmt.Sprintf("shape %s, reference %s", tensor.ShapeString(got.Shape), tensor.ShapeString(want.Shape))
	}
	if !got.DType.IsFloat() || !want.DType.IsFloat() {
		if got.DType != want.DType {
			return fmt.Sprintf("type %s, reference %s", got.DType, want.DType)
		}
		if string(got.Data) != string(want.Data) {
			return "values differ"
		}
		return ""
	}
	g, err := floats64(got)
	if err != nil {
		return err.Error()
	}
	w, err := floats64(want)
	if err != nil {
		return err.Error()
	}
	rtol := RTol
	switch want.DType {
	case tensor.Float16:
		rtol = max(rtol, 2*math.Ldexp(1, -10))
	case tensor.BFloat16:
		rtol = max(rtol, 2*math.Ldexp(1, -7))
	}
	for i := range g {
		a, b := g[i], w[i]
		switch {
		case math.IsNaN(a) || math.IsNaN(b):
			if math.IsNaN(a) != math.IsNaN(b) {
				return fmt.Sprintf("element %d: %g, reference %g", i, a, b)
			}
		case math.IsInf(a, 0) || math.IsInf(b, 0):
			if a != b {
				return fmt.Sprintf("element %d: %g, reference %g", i, a, b)
			}
		case math.Abs(a-b) > ATol+rtol*math.Abs(b):
			return fmt.Sprintf("element %d: %g, reference %g (tolerance %.1e + %.1e·|ref|)", i, a, b, ATol, rtol)
		}
	}
	return ""
}

// floats64 returns a float tensor's elements as float64, exactly.
func floats64(t *tensor.Tensor) ([]float64, error) {
	if t.DType == tensor.Float64 {
		n := int(t.Elements())
		if len(t.Data) != 8*n {
			return nil, fmt.Errorf("%d bytes for %d float64 elements", len(t.Data), n)
		}
		out := make([]float64, n)
		for i := range out {
			b := t.Data[8*i : 8*i+8]
			out[i] = math.Float64frombits(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
				uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56)
		}
		return out, nil
	}
	f, err := t.Float32s()
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
