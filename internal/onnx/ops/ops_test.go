package ops_test

import (
	"slices"
	"testing"

	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx/ops"
)

// TestTable holds the table to what its readers assume: one row per op and
// domain; autocast lists, data inputs and gradient rules only for the
// default domain (the stages apply them there alone); every gradient rule
// a row names exists in package vjp and every family there is named by a
// row; parameter slots only where a rule reads them; and no op both
// without float outputs and with index outputs among float ones.
func TestTable(t *testing.T) {
	seen := map[[2]string]bool{}
	families := map[string]bool{}
	for _, f := range vjp.Families() {
		families[f] = false
	}
	for _, o := range ops.All() {
		key := [2]string{o.Domain, o.Name}
		if seen[key] {
			t.Errorf("%s %q: two rows", o.Name, o.Domain)
		}
		seen[key] = true
		if o.Domain != ops.Default && o.Domain != ops.ML && o.Domain != ops.Microsoft {
			t.Errorf("%s: domain %q", o.Name, o.Domain)
		}
		if o.Domain != ops.Default && (o.Autocast != ops.Follow || o.DataInputs != 0 || o.Grad != "") {
			t.Errorf("%s (%s): autocast, data inputs and gradients apply to the default domain only", o.Name, o.Domain)
		}
		if got := ops.Lookup(o.Domain, o.Name); got == nil || got.Name != o.Name {
			t.Errorf("Lookup(%q, %q) = %v", o.Domain, o.Name, got)
		}
		if std := ops.Standard(o.Domain, o.Name); std != (o.Domain != ops.Microsoft) {
			t.Errorf("Standard(%q, %q) = %v", o.Domain, o.Name, std)
		}
		if o.Grad != "" && o.Grad != ops.NoGrad {
			if _, ok := families[o.Grad]; !ok {
				t.Errorf("%s: gradient rule %q, which package vjp does not have (it has %v)", o.Name, o.Grad, vjp.Families())
			}
			families[o.Grad] = true
		}
		if len(o.ParamInputs) > 0 && (o.Grad == "" || o.Grad == ops.NoGrad) {
			t.Errorf("%s: parameter inputs %v without a gradient rule to read them", o.Name, o.ParamInputs)
		}
		if o.HalfWeights && o.DataInputs == 0 {
			t.Errorf("%s: computes in its weights' dtype, but no data inputs set the weights apart", o.Name)
		}
		if o.NonFloat && len(o.IndexOutputs) > 0 {
			t.Errorf("%s: no float outputs, and index outputs among float ones", o.Name)
		}
	}
	for f, used := range families {
		if !used {
			t.Errorf("vjp's gradient rule %q: no row names it", f)
		}
	}
	if ops.Lookup("ai.onnx", "Conv") == nil || ops.Lookup("", "Conv").Autocast != ops.Lower {
		t.Error("ai.onnx is the default domain, and Conv is on autocast's lower-precision list")
	}
	if ops.Lookup("com.example", "Conv") != nil || ops.Standard("com.example", "Conv") {
		t.Error("an op type of another domain is not the standard's")
	}
	if !slices.Contains(vjp.Ops(), "Conv") || slices.Contains(vjp.Ops(), "Shape") {
		t.Errorf("vjp.Ops() = %v: want the rows with a rule", vjp.Ops())
	}
}
