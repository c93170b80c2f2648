package ops_test

import (
	"slices"
	"testing"

	"fp16audit/internal/grad/vjp"
	"fp16audit/internal/onnx/ops"
	"fp16audit/internal/onnx/shapes"
)

// TestTable holds the registry to what its readers assume: one entry per
// op and domain; autocast lists, data inputs, type and gradient rules,
// roles, selections and fills only for the default domain (the stages
// apply them there alone; a shape rule holds in any); every gradient rule an entry names
// exists in package vjp and every family there is named by an entry, and
// the same for the shape rules of package shapes; parameter slots only
// where a rule reads them; no op both without float outputs and with
// index outputs among float ones, nor with integer or bool outputs and
// float ones.
func TestTable(t *testing.T) {
	seen := map[[2]string]bool{}
	families := map[string]bool{}
	for _, f := range vjp.Families() {
		families[f] = false
	}
	shapeRules := map[string]bool{}
	for _, r := range shapes.Rules() {
		shapeRules[r] = false
	}
	for _, o := range ops.All() {
		key := [2]string{o.Domain, o.Name}
		if seen[key] {
			t.Errorf("%s %q: two entries", o.Name, o.Domain)
		}
		seen[key] = true
		if o.Domain != ops.Default && o.Domain != ops.ML && o.Domain != ops.Microsoft {
			t.Errorf("%s: domain %q", o.Name, o.Domain)
		}
		if o.Domain != ops.Default && (o.Autocast != ops.Follow || o.DataInputs != 0 || o.Grad != "" || o.Type != ops.TypeUnknown ||
			o.Role != 0 || o.Chooses != nil || o.GathersAt != 0 || o.Fill != "" || o.BiasInput != 0 || o.HalfFP32) {
			t.Errorf("%s (%s): autocast, data inputs, types, gradients, roles, selections and fills apply to the default domain only", o.Name, o.Domain)
		}
		if o.Shape != "" {
			if _, ok := shapeRules[o.Shape]; !ok {
				t.Errorf("%s: shape rule %q, which package shapes does not have (it has %v)", o.Name, o.Shape, shapes.Rules())
			}
			shapeRules[o.Shape] = true
		}
		if (o.Type == ops.TypeInt64 || o.Type == ops.TypeBool) && !o.NonFloat {
			t.Errorf("%s: integer or bool outputs, yet float ones too", o.Name)
		}
		if o.IndexType != ops.TypeUnknown && (len(o.IndexOutputs) == 0 || o.Type != ops.TypeInput) {
			t.Errorf("%s: an index type without index outputs beside a first output of the first input's type", o.Name)
		}
		if len(o.FillInputs) > 0 && o.Fill == "" {
			t.Errorf("%s: fill inputs without the PyTorch call that fills", o.Name)
		}
		if o.BiasInput > 0 && !o.Is(ops.Linear) {
			t.Errorf("%s: a bias input, but not a layer (ops.Linear)", o.Name)
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
		if o.HalfWeights && o.Epsilon && o.DataInputs == 0 {
			t.Errorf("%s: a normalization computing in its weights' dtype, but no data inputs set the weights apart", o.Name)
		}
		if o.NonFloat && len(o.IndexOutputs) > 0 {
			t.Errorf("%s: no float outputs, and index outputs among float ones", o.Name)
		}
	}
	for f, used := range families {
		if !used {
			t.Errorf("vjp's gradient rule %q: no entry names it", f)
		}
	}
	for r, used := range shapeRules {
		if !used {
			t.Errorf("shapes' rule %q: no entry names it", r)
		}
	}
	if ops.Lookup("ai.onnx", "Conv") == nil || ops.Lookup("", "Conv").Autocast != ops.Lower {
		t.Error("ai.onnx is the default domain, and Conv is on autocast's lower-precision list")
	}
	if ops.Lookup("com.example", "Conv") != nil || ops.Standard("com.example", "Conv") {
		t.Error("an op type of another domain is not the standard's")
	}
	if !slices.Contains(vjp.Ops(), "Conv") || slices.Contains(vjp.Ops(), "Shape") {
		t.Errorf("vjp.Ops() = %v: want the entries with a rule", vjp.Ops())
	}
}
