package execute

import (
	"fmt"
	"regexp"
	"strings"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// RunError is ONNX Runtime failing while it runs the passes on a batch:
// which pass, at which node of the model, on which batch and inputs, with
// what to do. The audit wraps it in its model error; a front door that
// made the batch (the Python package) adds what it assumed.
type RunError struct {
	// Pass is the pass whose copy of the node failed ("" when the node
	// is not one pass's).
	Pass string
	// Node, OpType and Module name the model's node; Added is set when
	// the node is one the audit adds for Node's value (a rounding, a
	// statistic).
	Node, OpType, Module string
	Added                bool
	// Batch is where the batch came from; Inputs what was fed, one
	// "name dtype [shape]" each.
	Batch  string
	Inputs []string
	// Status is ONNX Runtime's own message.
	Status string
	Err    error
}

// ortFailure matches ONNX Runtime's message for a kernel that failed.
var ortFailure = regexp.MustCompile(`running (\S+) node\. Name:'([^']*)' Status Message: (.*)`)

func (e *RunError) Error() string {
	where := fmt.Sprintf("node %q (%s", e.Node, e.OpType)
	if e.Module != "" {
		where += ", module " + e.Module
	}
	where += ")"
	if e.Added {
		where = fmt.Sprintf("a %s node the audit adds for %q", e.OpType, e.Node)
	}
	pass := "a pass"
	if e.Pass != "" {
		pass = "the " + e.Pass + " pass"
	}
	return fmt.Sprintf("ONNX Runtime failed in %s at %s on batch %s (inputs fed: %s): %s; %s",
		pass, where, e.Batch, strings.Join(e.Inputs, ", "), e.Status, e.advice())
}

func (e *RunError) Unwrap() error { return e.Err }

// advice says what to do about a failure, by what ONNX Runtime says.
func (e *RunError) advice() string {
	s := strings.ToLower(e.Status)
	switch {
	case strings.Contains(s, "out of data bounds") || strings.Contains(s, "out of bounds") || strings.Contains(s, "out of range"):
		return "an index the graph computes or reads is beyond the tensor it indexes: check the batch's values for the input it comes from (token ids against the vocabulary), and the shapes the export fixed (an axis traced as a constant, such as a recurrent state's (layers, batch, hidden) layout, that this batch does not have)"
	case strings.Contains(s, "shape") || strings.Contains(s, "broadcast") || strings.Contains(s, "dimension") || strings.Contains(s, "mismatch"):
		return "the batch's shapes do not fit a dimension the export fixed: export with that axis dynamic (dynamic_axes, dynamic_shapes) or feed the shapes it was exported with"
	}
	return "run the model with onnxruntime.InferenceSession on the same batch: if it fails there too, the export or the batch is at fault; if it does not, report it to fp16audit with the model and the batch"
}

// runFailure turns ONNX Runtime's error on batch b into a RunError, when
// it names the node that failed; passes are the names of the passes the
// graph runs, in order (the first keeps the model's node names, the others
// carry "::<pass>::fp16audit"), g the graph whose nodes it names.
func runFailure(err error, passes []string, g *onnx.GraphProto, b batch.Batch) error {
	m := ortFailure.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Errorf("batch %s: %w", b.Source, err)
	}
	re := &RunError{OpType: m[1], Status: strings.TrimSpace(m[3]), Batch: b.Source, Err: err}
	name := m[2]
	if len(passes) > 0 {
		re.Pass = passes[0]
	}
	if base, tag, ok := cutInternal(name); ok {
		for _, p := range passes[1:] {
			if tag == p {
				re.Pass, name = p, base
			}
		}
	}
	for {
		base, _, ok := cutInternal(name)
		if !ok {
			break
		}
		re.Added, name = true, base
	}
	re.Node = name
	if !re.Added {
		for _, n := range g.GetNode() {
			if n.Name == name {
				re.Module = onnx.ModulePath(n)
				break
			}
		}
	}
	for _, t := range b.Inputs {
		re.Inputs = append(re.Inputs, fmt.Sprintf("%s %s %s", t.Name, t.DType, tensor.ShapeString(t.Shape)))
	}
	return re
}

// cutInternal splits a name the audit made, "<base>::<tag>::fp16audit",
// into its base and tag.
func cutInternal(name string) (base, tag string, ok bool) {
	rest, ok := strings.CutSuffix(name, "::fp16audit")
	if !ok {
		return name, "", false
	}
	i := strings.LastIndex(rest, "::")
	if i < 0 {
		return name, "", false
	}
	return rest[:i], rest[i+2:], true
}
