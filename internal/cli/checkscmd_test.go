package cli

import (
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"fp16audit/checks"
)

func init() {
	// `go test ./internal/cli -update` rewrites docs/lint.md's check
	// reference; another test file may declare the flag already.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite generated files")
	}
}

// TestDocsCheckReference keeps the check reference in docs/lint.md and
// the check table in docs/audit.md equal to what the registry generates.
func TestDocsCheckReference(t *testing.T) {
	all := checks.All()
	syncBlock(t, "../../docs/lint.md", "checks", checksMarkdown(all))
	syncBlock(t, "../../docs/audit.md", "check table", checksTable(all, "lint.md"))
	doc, err := os.ReadFile("../../docs/lint.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if !strings.Contains(string(doc), "### "+c.ID+"\n") {
			t.Errorf("docs/lint.md does not document %s", c.ID)
		}
	}
}

// syncBlock checks that the block between <!-- BEGIN name --> and
// <!-- END name --> in path holds gen; with -update it writes gen there.
func syncBlock(t *testing.T, path, name, gen string) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- BEGIN "+name+" -->\n", "<!-- END "+name+" -->"
	re := regexp.MustCompile(`(?s)` + regexp.QuoteMeta(begin) + `.*?` + regexp.QuoteMeta(end))
	if !re.Match(doc) {
		t.Fatalf("%s has no %q ... %q block", path, strings.TrimSpace(begin), end)
	}
	want := re.ReplaceAllLiteral(doc, []byte(begin+gen+end))
	if f := flag.Lookup("update"); f != nil && f.Value.String() == "true" {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(doc) != string(want) {
		t.Errorf("%s: the generated %s is out of date; run go test ./internal/cli -run TestDocsCheckReference -update", path, name)
	}
}

func TestChecksCommand(t *testing.T) {
	code, out, _ := runMain(t, "checks", "--checks", "FP4*")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"FP4003  warning   lint", "FP4005  error     lint       autocast-fp16,half", "FP4001", "FP4002"} {
		if !strings.Contains(out, want) {
			t.Errorf("checks output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FP1001") {
		t.Errorf("--checks FP4* lists FP1001:\n%s", out)
	}

	code, out, _ = runMain(t, "checks", "--format", "json")
	var list []checkJSON
	if err := json.Unmarshal([]byte(out), &list); code != exitOK || err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	static := map[string]bool{}
	for _, c := range list {
		static[c.ID] = c.Static
	}
	if !static["FP4004"] || static["FP4001"] || len(list) != len(checks.All()) {
		t.Errorf("json: %d checks, static %v", len(list), static)
	}

	for _, args := range [][]string{{"checks", "extra"}, {"checks", "--format", "xml"}, {"checks", "--checks", "FP0"}} {
		if code, _, _ := runMain(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestExplainCommand(t *testing.T) {
	code, out, _ := runMain(t, "explain", "FP4004", "fp4005")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	c, _ := checks.Lookup("FP4004")
	for _, want := range []string{"FP4004: constant beyond the fp16 range", "default severity: error", "reported by: fp16audit lint", strings.TrimSpace(c.Doc), "FP4005: normalization epsilon", "policies: autocast-fp16, half"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	code, _, errs := runMain(t, "explain", "FP4999")
	if code != exitUsage || !strings.Contains(errs, `no check "FP4999"`) {
		t.Errorf("unknown ID: exit %d, stderr %q", code, errs)
	}
	if code, _, _ := runMain(t, "explain"); code != exitUsage {
		t.Errorf("no ID: exit %d, want 2", code)
	}
}
