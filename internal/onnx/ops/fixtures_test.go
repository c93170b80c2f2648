package ops_test

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// fixtures is the root of the fixture models: fixtures/models and
// fixtures/bench (made by fixtures/gen), and the exports of
// fixtures/torch (every family, the training exports and the model whose
// blocks are local functions).
const fixtures = "../../../fixtures"

// trainingFixtures are the folders of the exports the training audit
// differentiates: every op they use needs a gradient rule, or NoGrad.
var trainingFixtures = []string{"torch/train", "torch/train_dynamo", "torch/dynamo_train"}

// opUse is one (domain, op type) the fixtures use and the models that use
// it.
type opUse struct {
	domain, opType string
	models         []string
}

// fixtureOps returns every (domain, op type) the fixture models under
// root use, in their main graphs and subgraphs, with their local
// functions inlined as the audit inlines them (Flatten: the call of a
// function is no op of its own), sorted.
func fixtureOps(t *testing.T, root string) ([]opUse, int) {
	t.Helper()
	used := map[[2]string]*opUse{}
	models := 0
	var walk func(g *onnx.GraphProto, path string)
	walk = func(g *onnx.GraphProto, path string) {
		for _, n := range g.GetNode() {
			key := [2]string{n.GetDomain(), n.GetOpType()}
			u := used[key]
			if u == nil {
				u = &opUse{domain: key[0], opType: key[1]}
				used[key] = u
			}
			if !slices.Contains(u.models, path) {
				u.models = append(u.models, path)
			}
			for _, a := range n.GetAttribute() {
				if a.GetG() != nil {
					walk(a.GetG(), path)
				}
				for _, sg := range a.GetGraphs() {
					walk(sg, path)
				}
			}
		}
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".onnx") {
			return err
		}
		m, err := onnx.Load(p)
		if err != nil {
			return err
		}
		if err := m.Flatten(); err != nil {
			return err
		}
		models++
		rel, _ := filepath.Rel(fixtures, p)
		walk(m.Proto.GetGraph(), rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]opUse, 0, len(used))
	for _, u := range used {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b opUse) int {
		return strings.Compare(a.domain+"\x00"+a.opType, b.domain+"\x00"+b.opType)
	})
	return out, models
}

// TestFixtureOps lists every op the fixtures' exports use against the
// registry and fails on one that is used but has no entry: a new
// exporter, opset or model family that writes an op fp16audit does not
// know adds its entry (in the file of its family) with its fixture.
func TestFixtureOps(t *testing.T) {
	used, models := fixtureOps(t, fixtures)
	if models < 200 {
		t.Fatalf("%d models under %s: the fixtures moved", models, fixtures)
	}
	for _, u := range used {
		if ops.Lookup(u.domain, u.opType) == nil {
			t.Errorf("%s (domain %q) is used by %d fixture model(s), e.g. %s, but the registry has no entry for it: add one to the file of its family in internal/onnx/ops",
				u.opType, u.domain, len(u.models), u.models[0])
		}
	}
	t.Logf("%d op types in %d models", len(used), models)
}

// TestTrainingFixtureGradients: every op the training audit's fixtures
// use has a gradient rule, or says it passes none (NoGrad).
func TestTrainingFixtureGradients(t *testing.T) {
	for _, dir := range trainingFixtures {
		used, models := fixtureOps(t, filepath.Join(fixtures, dir))
		if models == 0 {
			t.Fatalf("no models under %s", dir)
		}
		for _, u := range used {
			if o := ops.Lookup(u.domain, u.opType); o != nil && o.Grad == "" {
				t.Errorf("%s is used by %s, which the training audit differentiates, but its entry names no gradient rule (Grad)", u.opType, u.models[0])
			}
		}
	}
}
