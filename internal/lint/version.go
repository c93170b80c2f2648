package lint

import (
	"fmt"

	"fp16audit/checks"
)

var checkVersion = checks.Register(&checks.Check{ID: "FP4007", Title: "ir or opset version onnx runtime cannot load", Severity: checks.SevError, Doc: `The model is stamped with an IR version or an operator set version that
ONNX Runtime 1.30, the runtime fp16audit runs models on, refuses: IR
versions above 13, ai.onnx opsets above 26 or ai.onnx.ml opsets above 5
(it fails with "Unsupported model IR version" or "ONNX Runtime only
guarantees support for models stamped with official released onnx opset
versions"). ai.onnx opsets below 7 are a warning: ONNX Runtime only
guarantees support from opset 7. 'fp16audit run' cannot audit such a
model, and neither can most deployment runtimes. Export with the
opset_version argument of torch.onnx.export set to a supported opset (17
or 18 are good choices), or convert with onnx.version_converter.`})

var versionAnalyzer = &Analyzer{Check: checkVersion, Run: runVersion}

// Limits of ONNX Runtime 1.30.0 (the build the Makefile installs),
// measured by creating sessions from a one-node model: IR 13 loads, 14
// fails with "Unsupported model IR version: 14, max supported IR version:
// 13"; ai.onnx opset 26 loads, 27 fails with "Current official support for
// domain ai.onnx is till opset 26"; ai.onnx.ml 5 loads, 6 fails the same
// way. The lower bound is ONNX Runtime's documented backwards
// compatibility (docs/Versioning.md: opset 7 and later).
const (
	ortMaxIR     = 13
	ortMaxOpset  = 26
	ortMaxMLOps  = 5
	ortMinOpset  = 7
	ortVersionID = "ONNX Runtime 1.30"
)

func runVersion(f *Facts) ([]checks.Finding, error) {
	m := f.Model.Proto
	var out []checks.Finding
	add := func(sev checks.Severity, value, msg string) {
		out = append(out, f.finding(checkVersion, sev, -1, value, msg))
	}
	if ir := m.GetIrVersion(); ir > ortMaxIR {
		add(checks.SevError, fmt.Sprintf("ir_version=%d", ir), fmt.Sprintf(
			"the model has IR version %d; %s loads IR versions up to %d: export with an onnx package that writes IR %d or older",
			ir, ortVersionID, ortMaxIR, ortMaxIR))
	}
	for _, o := range m.GetOpsetImport() {
		v := o.GetVersion()
		switch o.GetDomain() {
		case "", "ai.onnx":
			if v > ortMaxOpset {
				add(checks.SevError, fmt.Sprintf("opset ai.onnx=%d", v), fmt.Sprintf(
					"the model imports ai.onnx opset %d; %s supports opsets up to %d: export with opset_version=%d or lower",
					v, ortVersionID, ortMaxOpset, ortMaxOpset))
			} else if v < ortMinOpset {
				add(checks.SevWarning, fmt.Sprintf("opset ai.onnx=%d", v), fmt.Sprintf(
					"the model imports ai.onnx opset %d; ONNX Runtime guarantees support from opset %d: export with a newer opset_version",
					v, ortMinOpset))
			}
		case "ai.onnx.ml":
			if v > ortMaxMLOps {
				add(checks.SevError, fmt.Sprintf("opset ai.onnx.ml=%d", v), fmt.Sprintf(
					"the model imports ai.onnx.ml opset %d; %s supports ai.onnx.ml opsets up to %d",
					v, ortVersionID, ortMaxMLOps))
			}
		}
	}
	return out, nil
}
