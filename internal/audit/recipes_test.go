package audit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/internal/audit"
	"fp16audit/report"
)

// recipesPage is the documentation page that holds the export recipes.
const recipesPage = "docs/how-to/export.md"

// torchRecipes are the export recipes of recipesPage as fixtures/torch/recipes.py
// ran them, verbatim, under torch 2.9 (make fixtures-torch2).
const torchRecipes = "../../fixtures/torch/recipes"

// readmeRecipes returns the recipes of recipesPage: the ```python block after
// each line "<!-- recipe: NAME … -->", by name, as recipes.py reads them.
func readmeRecipes(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("../../" + recipesPage)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	var name string
	var code []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case in && line == "```":
			out[name] = strings.Join(code, "\n")
			in, name, code = false, "", nil
		case in:
			code = append(code, line)
		case name != "" && line == "```python":
			in = true
		case strings.HasPrefix(line, "<!-- recipe: "):
			name = strings.Fields(strings.TrimPrefix(line, "<!-- recipe: "))[0]
			if _, dup := out[name]; dup {
				t.Fatalf("%s: recipe %s appears twice", recipesPage, name)
			}
		default:
			name = ""
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// recipeExtra is what recipes.py records beside a recipe's truth.
type recipeExtra struct {
	Extra struct {
		Recipe struct {
			Name string `json:"name"`
			Code string `json:"code"`
		} `json:"recipe"`
		LMLoss *float64 `json:"lm_loss"`
	} `json:"extra"`
}

// TestReadmeRecipes: every export recipe of recipesPage (once the
// README's) is the text that fixtures/torch/recipes.py ran under torch 2.9
// to make a fixture, so the page cannot drift from what torch does with
// it; and each of those
// fixtures audits as PyTorch says it runs (verdict, by module, under each
// policy).
func TestReadmeRecipes(t *testing.T) {
	want := readmeRecipes(t)
	for _, name := range []string{"images", "tables", "tokens"} {
		if _, ok := want[name]; !ok {
			t.Errorf("%s has no recipe %q (a line <!-- recipe: %s --> before its ```python block)", recipesPage, name, name)
		}
	}
	dirs, err := filepath.Glob(filepath.Join(torchRecipes, "*", "truth.json"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no recipe fixtures under %s: %v", torchRecipes, err)
	}
	ran := map[string]bool{}
	for _, p := range dirs {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var x recipeExtra
		if err := json.Unmarshal(data, &x); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		r := x.Extra.Recipe
		ran[r.Name] = true
		code, ok := want[r.Name]
		switch {
		case !ok:
			t.Errorf("%s ran recipe %q, which the page no longer has: regenerate the recipes (make fixtures-torch2)", p, r.Name)
		case code != r.Code:
			t.Errorf("recipe %q of %s is not the text %s ran: regenerate the recipes (make fixtures-torch2) so that torch runs what the page says\npage:\n%s\nran:\n%s", r.Name, recipesPage, p, code, r.Code)
		}
	}
	for name := range want {
		if !ran[name] {
			t.Errorf("recipe %q has no fixture: add it to fixtures/torch/recipes.py", name)
		}
	}
	torchTruth(t, torchRecipes, map[string]string{})
}

// TestRecipeLanguageModelLoss: the tokens recipe's Llama export audits
// training with --loss cross-entropy --lm-shift, and its loss is PyTorch's
// (labels=input_ids, recorded by recipes.py) on the batch the recipe
// saved, pad tokens included as Hugging Face counts them.
func TestRecipeLanguageModelLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := filepath.Join(torchRecipes, "recipe_tokens_llama")
	var x recipeExtra
	readJSON(t, filepath.Join(dir, "truth.json"), &x)
	if x.Extra.LMLoss == nil {
		t.Fatal("truth.json: no lm_loss")
	}
	r, err := audit.Run(context.Background(), audit.Config{ModelPath: filepath.Join(dir, "model.onnx"),
		Inputs: []string{filepath.Join(dir, "batches")}, Train: audit.TrainConfig{Loss: "cross-entropy", LMShift: true}})
	if err != nil {
		t.Fatal(err)
	}
	b := r.Training.Backward
	if b.LossValue == nil || math.Abs(*b.LossValue-*x.Extra.LMLoss) > 1e-5*math.Abs(*x.Extra.LMLoss) {
		t.Errorf("loss %v, PyTorch's %v", b.LossValue, *x.Extra.LMLoss)
	}
	if b.Verdict == report.BackwardFP32Broken || len(b.Unsupported) != 0 {
		t.Errorf("backward verdict %s, ops without a gradient %+v: PyTorch's fp32 backward is finite", b.Verdict, b.Unsupported)
	}
	if !slices.ContainsFunc(b.Parameters, func(p report.ParameterReport) bool { return strings.Contains(p.Module, "down_proj") }) {
		t.Errorf("no parameter gradient of an MLP's down_proj among %d: module paths are not PyTorch's", len(b.Parameters))
	}
}
