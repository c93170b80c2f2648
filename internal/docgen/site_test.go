package docgen

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// browser finds a headless Chromium: without one the test skips, except
// in CI (CI set), where .ci/run installs Debian's chromium.
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "" {
		t.Skip("chromium not installed (apt-get install chromium); CI requires it")
	}
	t.Fatal("chromium not installed; .ci/run installs it")
	return ""
}

// open runs the browser headless on a built page, with everything that
// could reach the network off, and returns the DOM after its scripts ran.
func open(t *testing.T, bin, page string, extra ...string) string {
	t.Helper()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--virtual-time-budget=5000", "--user-data-dir=" + t.TempDir()}, extra...)
	args = append(args, "file://"+page)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", page, err, stderr.String())
	}
	if strings.Contains(stderr.String(), "Uncaught") {
		t.Errorf("%s: script error in the console:\n%s", page, stderr.String())
	}
	return stdout.String()
}

// TestSite opens pages of the built site (make docs builds it and names
// it in FP16AUDIT_SITE_DIR) in headless Chromium and checks that they
// render: the theme's navigation, a generated check page, a verdict page
// and the HTML report it embeds (a run's and a replay's), the guide with
// the real outputs it includes, a tutorial, and the Python API that
// mkdocstrings rendered from the docstrings, with a section for every
// public module of python/fp16audit; and that a screenshot of the home
// page is not blank.
func TestSite(t *testing.T) {
	site := os.Getenv("FP16AUDIT_SITE_DIR")
	if site == "" {
		t.Skip("FP16AUDIT_SITE_DIR is not set: make docs builds the site and runs this test on it")
	}
	bin := browser(t)
	for _, tc := range []struct {
		page string
		want []string
	}{
		{"index.html", []string{`class="md-nav`, "From symptom to fix", "Where to start"}},
		{"reference/checks/FP2001/index.html", []string{"FP2001: op overflows in fp16", "fp16audit explain FP2001", "all checks"}},
		{"reference/verdicts/run/unnormalized-input/index.html", []string{"unnormalized-input", `<iframe class="fp16audit-report"`, "The whole report"}},
		{"reference/verdicts/run/unnormalized-input.html", []string{`data-ready="1"`, `<svg id="chart"`, `<span id="verdict-id">unnormalized-input</span>`}},
		{"reference/verdicts/replay/gradient-overflow/index.html", []string{"gradient-overflow", `<iframe class="fp16audit-report"`, "step-000023-scale-collapse"}},
		{"reference/verdicts/replay/gradient-overflow.html", []string{`<span id="verdict-id">gradient-overflow</span>`, `aria-label="log2 of the loss scale"`}},
		{"guide/symptom-to-fix/index.html", []string{"NaN in the first epoch", "verdict: unnormalized-input", "verdict: gradient-overflow", "verdict: underflow"}},
		{"tutorials/fastai-vision/index.html", []string{"learn.fp16audit()", "FP16Preflight"}},
		{"api/python/index.html", []string{"fp16audit.audit", "raise_for_failure"}},
		{"reference/cli/index.html", []string{"fp16audit run --help", "--fail-on"}},
	} {
		t.Run(tc.page, func(t *testing.T) {
			p := filepath.Join(site, filepath.FromSlash(tc.page))
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("the site has no %s: %v", tc.page, err)
			}
			dom := open(t, bin, p, "--dump-dom")
			for _, w := range tc.want {
				if !strings.Contains(dom, w) {
					t.Errorf("the rendered %s lacks %q", tc.page, w)
				}
			}
		})
	}
	// Every public module of the package is on the API page, by
	// generation: a module added (a trainer's adapter) needs no edit.
	api, err := os.ReadFile(filepath.Join(site, "api", "python", "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	mods, err := filepath.Glob(filepath.Join("..", "..", "python", "fp16audit", "*.py"))
	if err != nil || len(mods) == 0 {
		t.Fatalf("no modules in python/fp16audit: %v", err)
	}
	for _, m := range mods {
		name := strings.TrimSuffix(filepath.Base(m), ".py")
		if strings.HasPrefix(name, "_") {
			continue
		}
		if !bytes.Contains(api, []byte(`id="fp16audit.`+name+`"`)) {
			t.Errorf("the Python API page has no section for fp16audit.%s", name)
		}
	}
	shot := filepath.Join(t.TempDir(), "home.png")
	open(t, bin, filepath.Join(site, "index.html"), "--screenshot="+shot, "--window-size=1280,1000", "--hide-scrollbars")
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 20000 {
		t.Errorf("screenshot of the home page missing or blank: %v", err)
	}
}
