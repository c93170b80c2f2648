package words

import (
	"strings"
	"testing"
)

// TestTable: every row says every phrase, and its formats take their
// arguments (no %!verb left in a text).
func TestTable(t *testing.T) {
	if _, ok := Lookup(Default); !ok {
		t.Fatalf("the default trainer %q has no row", Default)
	}
	seen := map[string]bool{}
	for _, tr := range table {
		if seen[tr.Name] {
			t.Errorf("%s: two rows", tr.Name)
		}
		seen[tr.Name] = true
		texts := map[string]string{
			"BF16":           tr.BF16For("cpu"),
			"MixedOff":       tr.MixedOff,
			"StartScale":     tr.StartScale(12),
			"Keep autocast":  tr.Keep(false, "cpu", "it", "its", "returns"),
			"Keep half":      tr.Keep(true, "cpu", "them", "their", "return"),
			"Normalize img":  tr.Normalize("pixel_values", true, "Normalize.from_stats([0.5], [0.2])", "transforms.Normalize(mean=[0.5], std=[0.2])"),
			"Normalize tab":  tr.Normalize("x", false, "procs=[Normalize]", "x = (x - 1) / 2"),
			"Normalize else": tr.Normalize("wave", false, "", "wave = wave / 32768"),
			"Label":          tr.Label,
			"FP32":           tr.FP32,
			"Clip":           tr.ClipAt("0.37"),
			"LowerLR":        tr.LowerLRTo("0.0005"),
			"DropBatch":      tr.DropBatch,
		}
		for what, s := range texts {
			if s == "" || strings.Contains(s, "%!") {
				t.Errorf("%s %s: %q", tr.Name, what, s)
			}
		}
		if !strings.Contains(texts["StartScale"], "2.**12") {
			t.Errorf("%s: StartScale(12) = %q does not name 2.**12", tr.Name, texts["StartScale"])
		}
		if !strings.Contains(texts["Keep autocast"], `device_type="cpu"`) {
			t.Errorf("%s: the keep-fp32 text does not name the autocast device: %q", tr.Name, texts["Keep autocast"])
		}
		if !strings.Contains(texts["Clip"], "0.37") || !strings.Contains(texts["LowerLR"], "0.0005") {
			t.Errorf("%s: the clip or learning-rate text loses its number: %q, %q", tr.Name, texts["Clip"], texts["LowerLR"])
		}
		if !strings.Contains(texts["Normalize img"], `"pixel_values"`) || !strings.Contains(texts["Normalize else"], "32768") {
			t.Errorf("%s: the normalize texts lose the input or the call: %q, %q", tr.Name, texts["Normalize img"], texts["Normalize else"])
		}
	}
}

// TestWords: the phrases each trainer's users write.
func TestWords(t *testing.T) {
	for name, want := range map[string]string{
		"":             "learn.to_bf16()",
		"fastai":       "learn.to_bf16()",
		"transformers": "bf16=True in TrainingArguments",
		"lightning":    `Trainer(precision="bf16-mixed")`,
		"accelerate":   `Accelerator(mixed_precision="bf16")`,
		"torch":        `torch.autocast(device_type="mps", dtype=torch.bfloat16) without a GradScaler`,
	} {
		if got := For(name).BF16For("mps"); got != want {
			t.Errorf("%q: bf16 is %q, want %q", name, got, want)
		}
	}
	if _, ok := Lookup("keras"); ok {
		t.Error("Lookup found a trainer the table does not have")
	}
	if For("keras").Name != Default {
		t.Error("For of an unknown name is not the default row")
	}
	for name, want := range map[string]string{
		"fastai":       "GradientClip(max_norm=1)",
		"transformers": "max_grad_norm=1 in TrainingArguments",
		"lightning":    "Trainer(gradient_clip_val=1)",
		"accelerate":   "accelerator.clip_grad_norm_(model.parameters(), max_norm=1)",
		"torch":        "scaler.unscale_(optimizer)",
	} {
		if got := For(name).ClipAt("1"); !strings.Contains(got, want) {
			t.Errorf("%s: clipping is %q, want it to say %q", name, got, want)
		}
	}
	if half := For("transformers").Keep(true, "", "it", "its", "returns"); !strings.Contains(half, "_keep_in_fp32_modules") {
		t.Errorf("transformers under half: %q does not name _keep_in_fp32_modules", half)
	}
}
