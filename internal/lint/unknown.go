package lint

import (
	"fmt"

	"fp16audit/checks"
)

// UnknownOpsAnalyzer is FP4002. The dynamic audit runs it too: it emulates
// the policy over the same ops.
var UnknownOpsAnalyzer = &Analyzer{Check: checkUnknownOps, Run: runUnknownOps}

var checkUnknownOps = checks.Register(&checks.Check{ID: "FP4002", Title: "ops of unknown precision", Severity: checks.SevInfo, Doc: `The graph contains ops outside the standard ONNX domain or unknown to
fp16audit's autocast tables. They are emulated as following their inputs'
precision, which may differ from what the real kernel does.`})

func runUnknownOps(f *Facts) ([]checks.Finding, error) {
	c := checkUnknownOps
	var out []checks.Finding
	for _, i := range f.Assign.Unknown {
		n := f.node(i)
		op := n.GetOpType()
		if d := n.GetDomain(); d != "" {
			op = d + "::" + op
		}
		value := ""
		if len(n.GetOutput()) > 0 {
			value = n.GetOutput()[0]
		}
		out = append(out, f.finding(c, checks.SevInfo, i, value, fmt.Sprintf(
			"%s runs %s, an op of unknown precision; assumed to compute like its inputs (%s under %s), which the real kernel may not do",
			f.where(i), op, f.Assign.Node[i], f.Policy.Name)))
	}
	return out, nil
}
