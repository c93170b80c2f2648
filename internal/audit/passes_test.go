package audit_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/report"
)

// TestPassesOnDemand: a healthy audit runs fp32 and the policy's pass
// only; the bf16 what-if runs when the fp16 pass fails (after the others,
// so without the element-wise comparison) or when --passes asks for it
// (beside them, compared), and never under --passes none.
func TestPassesOnDemand(t *testing.T) {
	healthy := filepath.Join(fixtureDir, "models", "healthy.onnx")
	overflow := filepath.Join(fixtureDir, "models", "overflowing_op.onnx")
	for _, c := range []struct {
		name, model, batch string
		passes             []string
		want               []string
		bf16Fix, note      bool
	}{
		{"healthy auto", healthy, "healthy.npy", nil, []string{"fp32", "fp16"}, false, false},
		{"healthy asked", healthy, "healthy.npy", []string{"bf16"}, []string{"fp32", "fp16", "bf16"}, false, false},
		{"healthy all", healthy, "healthy.npy", []string{"all"}, []string{"fp32", "fp16", "bf16"}, false, false},
		{"overflow auto", overflow, "overflowing_op.npy", []string{"auto"}, []string{"fp32", "fp16", "bf16"}, true, true},
		{"overflow asked", overflow, "overflowing_op.npy", []string{"bf16"}, []string{"fp32", "fp16", "bf16"}, true, false},
		{"overflow none", overflow, "overflowing_op.npy", []string{"none"}, []string{"fp32", "fp16"}, false, false},
	} {
		r := runConfig(t, audit.Config{ModelPath: c.model, Inputs: []string{batchPath(c.batch)}, Passes: c.passes, NoFixes: true})
		if !slices.Equal(r.Passes, c.want) {
			t.Errorf("%s: passes %v, want %v", c.name, r.Passes, c.want)
		}
		fix := slices.ContainsFunc(r.Fixes, func(f report.Fix) bool { return f.Kind == report.FixBF16 })
		if fix != c.bf16Fix {
			t.Errorf("%s: bf16 fix reported %v, want %v (%+v)", c.name, fix, c.bf16Fix, r.Fixes)
		}
		note := strings.Contains(strings.Join(r.Notes, "\n"), "the bf16 pass ran because the fp16 pass's outputs hold NaN/Inf")
		if note != c.note {
			t.Errorf("%s: note on the bf16 pass %v, want %v: %v", c.name, note, c.note, r.Notes)
		}
		if !slices.Contains(r.Passes, "bf16") {
			continue
		}
		// Beside the fp32 pass the bf16 pass is compared with it; run
		// after, alone, it is not.
		compared := false
		for _, n := range r.Nodes {
			for _, o := range n.Outputs {
				if s, ok := o.Stats["bf16"]; ok && s.Compared > 0 {
					compared = true
				}
			}
		}
		if compared != !c.note {
			t.Errorf("%s: bf16 compared with fp32 %v, want %v", c.name, compared, !c.note)
		}
	}
	_, err := audit.Run(t.Context(), audit.Config{ModelPath: healthy, Inputs: []string{batchPath("healthy.npy")}, Passes: []string{"bf16", "none"}})
	if err == nil || !audit.IsUsage(err) || !strings.Contains(err.Error(), `"none" stands alone`) {
		t.Errorf("--passes bf16,none: got %v, want a usage error", err)
	}
}
