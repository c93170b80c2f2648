package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const scalesData = "../trainlog/testdata/"

func runScales(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return run(t, append([]string{"scales"}, args...)...)
}

func TestScalesExitCodes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"healthy", []string{scalesData + "healthy.json"}, exitOK, ""},
		{"early nan is an error", []string{scalesData + "early_nan.csv"}, exitFindings, ""},
		{"gradient overflow", []string{scalesData + "gradient_overflow_nan.json"}, exitFindings, ""},
		{"plateau warns", []string{scalesData + "plateau_underflow.json", "--baseline", scalesData + "baseline_fp32.json"}, exitOK, ""},
		{"plateau fails on warning", []string{scalesData + "plateau_underflow.json", "--baseline", scalesData + "baseline_fp32.json", "--fail-on", "warning"}, exitFindings, ""},
		{"never", []string{scalesData + "early_nan.json", "--fail-on", "never"}, exitOK, ""},
		{"info never fails", []string{scalesData + "wasted_warmup.json", "--fail-on", "warning"}, exitOK, ""},
		{"no argument", nil, exitUsage, "want exactly one RUN log"},
		{"bad fail-on", []string{scalesData + "healthy.json", "--fail-on", "info"}, exitUsage, "--fail-on"},
		{"bad format", []string{scalesData + "healthy.json", "--format", "sarif"}, exitUsage, "--format"},
		{"bad tolerance", []string{scalesData + "healthy.json", "--plateau-tolerance", "-1"}, exitUsage, "--plateau-tolerance"},
		{"unknown flag", []string{scalesData + "healthy.json", "--nope"}, exitUsage, "unknown flag"},
		{"missing file", []string{filepath.Join(dir, "missing.json")}, exitUsage, "no such file"},
		{"empty file", []string{write("empty.json", "")}, exitUsage, "empty file"},
		{"csv without header", []string{write("nohead.csv", "0,2.3,65536\n")}, exitUsage, "want a header naming the columns step,loss,scale"},
		{"string scales", []string{write("str.json", `{"scales": ["65536"]}`)}, exitUsage, `scales[0]: want a number, found string "65536"`},
		{"zero scale", []string{write("zero.csv", "step,scale\n0,65536\n1,0\n")}, exitUsage, "zero.csv:3: scale: want a positive finite loss scale, found 0"},
		{"mismatched lengths", []string{write("mis.json", `{"losses": [1, 2], "scales": [65536]}`)}, exitUsage, "scales has 1 entries and losses 2"},
		{"baseline without losses", []string{scalesData + "healthy.json", "--baseline", scalesData + "healthy_scales_only.json"}, exitUsage, "has no losses"},
		{"other column names", []string{write("it.csv", "iteration,train_loss,loss_scale\n0,2.5,32768\n1,nan,16384\n")}, exitFindings, ""},
		{"mapped columns", []string{write("m.csv", "n,obj,s\n0,2.5,32768\n1,2.4,32768\n"), "--columns", "step=n,loss=obj,scale=s"}, exitOK, ""},
		{"unknown columns", []string{write("u.csv", "n,obj,s\n0,2.5,32768\n")}, exitUsage, "u.csv:1: the log has neither losses nor scales: no column holds the loss or the loss scale"},
		{"bad columns flag", []string{scalesData + "healthy.json", "--columns", "lr=x"}, exitUsage, "--columns: \"lr=x\": want one of step, epoch, loss, scale, skipped"},
		{"columns and tag disagree", []string{scalesData + "healthy.json", "--columns", "loss=a", "--tag", "loss=b"}, exitUsage, "disagree"},
		{"bad series", []string{scalesData + "healthy.json", "--series", "losses"}, exitUsage, "--series \"losses\": want loss, scale or fastai-scales"},
		{"bad underflow fraction", []string{scalesData + "healthy.json", "--underflow-fraction", "0"}, exitUsage, "--underflow-fraction"},
		{"bad lost mass tolerance", []string{scalesData + "healthy.json", "--lost-mass-tolerance", "2"}, exitUsage, "--lost-mass-tolerance 2: want a fraction above 0"},
		{"nan check off", []string{scalesData + "early_nan.csv", "--checks", "-FP5001"}, exitOK, ""},
		{"only the nan checks", []string{scalesData + "early_nan.csv", "--checks", "FP500*"}, exitFindings, ""},
		{"bad checks", []string{scalesData + "healthy.json", "--checks", "FP5999"}, exitUsage, "--checks: checks \"FP5999\": no check FP5999"},
		{"scales list", []string{scalesData + "companion/gradient_overflow_nan.scales.npy"}, exitFindings, ""},
		{"losses list as scales", []string{scalesData + "companion/gradient_overflow_nan.losses.npy", "--series", "scale"}, exitUsage, "gradient_overflow_nan.losses.npy: [351]: want a positive finite loss scale, found +Inf (a list of loss scales; pass --series loss"},
		{"companion log", []string{scalesData + "companion/gradient_overflow_nan.jsonl"}, exitFindings, ""},
		{"companion as baseline", []string{scalesData + "companion/gradient_overflow_nan.jsonl", "--baseline", scalesData + "companion/gradient_overflow_nan.losses.npy", "--series", "scale"}, exitFindings, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runScales(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tt.code, stderr)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.stderr)
			}
		})
	}
}

func TestScalesHelp(t *testing.T) {
	code, stdout, _ := runScales(t, "--help")
	if code != exitOK || !strings.Contains(stdout, "Example:") || !strings.Contains(stdout, "fp16audit scales run.json --baseline fp32.json") ||
		!strings.Contains(stdout, "--plateau-tolerance") {
		t.Errorf("exit %d, help:\n%s", code, stdout)
	}
}

func TestScalesJSONShape(t *testing.T) {
	out := filepath.Join(t.TempDir(), "diag.json")
	code, stdout, stderr := runScales(t, scalesData+"gradient_overflow_nan.json", "--format", "json", "--output", out)
	if code != exitFindings || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	doc := readJSON(t, out)
	for _, key := range []string{"schema", "run", "grad_scaler", "thresholds", "verdict", "verdict_text", "fix", "scales", "losses", "epochs", "series", "findings", "not_derived", "notes"} {
		if _, ok := doc[key]; !ok {
			t.Errorf("JSON report lacks %q", key)
		}
	}
	if doc["schema"] != "fp16audit.scales/v1.2" || doc["verdict"] != "gradient-overflow-nan" {
		t.Errorf("schema %v verdict %v", doc["schema"], doc["verdict"])
	}
	scales := doc["scales"].(map[string]any)
	if scales["skipped_steps"] != 55.0 || scales["min_scale"] != 0x1p-30 {
		t.Errorf("skipped_steps %v min_scale %v", scales["skipped_steps"], scales["min_scale"])
	}
	if doc["losses"].(map[string]any)["first_nonfinite_step"] != 700.0 {
		t.Errorf("first_nonfinite_step %v", doc["losses"].(map[string]any)["first_nonfinite_step"])
	}
	f := doc["findings"].([]any)[0].(map[string]any)
	if f["check"] != "FP5002" || f["severity"] != "error" {
		t.Errorf("first finding %v", f)
	}
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".diag.json.tmp*"))
	if len(matches) != 0 {
		t.Errorf("temp files left: %v", matches)
	}
}

func TestScalesTextLeadsWithVerdict(t *testing.T) {
	code, stdout, _ := runScales(t, scalesData+"wasted_warmup.csv")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	lines := strings.Split(stdout, "\n")
	if len(lines) < 6 || !strings.HasPrefix(lines[4], "verdict: wasted-warmup") || !strings.Contains(stdout, "to_fp16(init_scale=2**7)") {
		t.Errorf("text report:\n%s", stdout)
	}
}

func TestScalesUsageListed(t *testing.T) {
	var out bytes.Buffer
	Main([]string{"help"}, &out, &out)
	if !strings.Contains(out.String(), "fp16audit scales RUN") {
		t.Errorf("usage does not list scales:\n%s", out.String())
	}
}

// TestScalesChecksFlag: a check switched off neither reports nor decides
// the verdict, and the report says which checks ran.
func TestScalesChecksFlag(t *testing.T) {
	code, stdout, stderr := runScales(t, scalesData+"gradient_overflow_nan.json", "--checks", "all,-FP5002", "--format", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{`"checks": "all,-FP5002"`, `"verdict": "healthy"`, `"check": "FP5009"`, `"check": "FP5010"`,
		`unjudged: --checks all,-FP5002 switched off FP5002 (nan after the loss scale collapsed)`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("no %s in:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, `"check": "FP5002"`) {
		t.Errorf("FP5002 reported although switched off")
	}
	_, stdout, _ = runScales(t, scalesData+"gradient_overflow_nan.json", "--checks", "-FP5009")
	if !strings.Contains(stdout, "checks: -FP5009\n") {
		t.Errorf("text does not say which checks ran:\n%s", stdout)
	}
	if strings.Contains(stdout, "warning FP5009") {
		t.Errorf("FP5009 reported although switched off:\n%s", stdout)
	}
}
