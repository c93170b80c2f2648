package render

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"fp16audit/report"
)

// chromium finds a headless browser for the browser tests. Without one the
// tests skip, except in CI (CI set), where .ci/run installs Debian's
// chromium and a missing browser is a failure.
func chromium(t *testing.T) string {
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

// runChromium runs the browser headless on a local file with everything
// that could reach the network turned off, and returns its stdout.
func runChromium(t *testing.T, bin, page string, extra ...string) []byte {
	t.Helper()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}, extra...)
	args = append(args, "file://"+page)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(extra, " "), err, stderr.String())
	}
	if strings.Contains(stderr.String(), "Uncaught") {
		t.Errorf("script error in the console:\n%s", stderr.String())
	}
	return stdout.Bytes()
}

// hoverProbe is appended to a copy of the page: it moves the mouse over the
// chart and checks that the tooltip names the node under it.
const hoverProbe = `<script>
(function () {
  var hit = document.getElementById("hit"), r = hit.getBoundingClientRect();
  hit.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + 2, clientY: r.top + r.height / 2, bubbles: true}));
  var tip = document.getElementById("tip");
  document.body.setAttribute("data-hover", tip.hidden ? "hidden" : tip.textContent.slice(0, 80));
})();
</script>`

var bodyTag = regexp.MustCompile(`<body[^>]*>`)

// TestBrowser renders the demo report in headless Chromium and checks the
// DOM after the script ran: the verdict, the chart, the filled node table,
// a working tooltip and no script error. With -update it also writes the
// README's screenshot, docs/demo-report.png.
func TestBrowser(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	var page bytes.Buffer
	if err := auditHTML(&page, loadReport(t, "demo_cnn")); err != nil {
		t.Fatal(err)
	}
	probed := strings.Replace(page.String(), "</body>", hoverProbe+"</body>", 1)
	path := filepath.Join(dir, "demo.html")
	if err := os.WriteFile(path, []byte(probed), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(runChromium(t, bin, path, "--dump-dom"))
	body := bodyTag.FindString(dom)
	if !strings.Contains(body, `data-ready="1"`) || strings.Contains(body, "data-error") {
		t.Fatalf("the page's script did not finish cleanly: %s", body)
	}
	for _, want := range []string{
		`<span id="verdict-id">unnormalized-input</span>`,
		"the inputs are not normalized",
		`<svg id="chart"`, `class="series"`, "fp16 max 65504", "origin: conv1 (Conv)",
		`<table id="nodes"`, `<tr data-pos="0" class="orig">`, "showing 13 of 13 rows",
		`data-hover="#0 /conv1/Conv`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered DOM lacks %q", want)
		}
	}
	if *update {
		out, err := filepath.Abs(filepath.Join("..", "..", "docs", "demo-report.png"))
		if err != nil {
			t.Fatal(err)
		}
		// The README shows the release's version, not the tests' blank.
		r := loadReport(t, "demo_cnn")
		r.Tool.Version = report.Version
		page.Reset()
		if err := auditHTML(&page, r); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		runChromium(t, bin, path, "--screenshot="+out, "--window-size=1400,1800", "--hide-scrollbars")
		if _, err := os.Stat(out); err != nil {
			t.Fatalf("no screenshot written: %v", err)
		}
	} else {
		shot := filepath.Join(dir, "demo.png")
		runChromium(t, bin, path, "--screenshot="+shot, "--window-size=1400,1800")
		if fi, err := os.Stat(shot); err != nil || fi.Size() < 10000 {
			t.Errorf("screenshot %s missing or blank: %v", shot, err)
		}
	}
}

// TestBrowserLarge loads the page of a 20 000-node model and logs its size
// and how long the browser took until the script finished.
func TestBrowserLarge(t *testing.T) {
	bin := chromium(t)
	var page bytes.Buffer
	if err := auditHTML(&page, syntheticReport(20000)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "large.html")
	if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	dom := string(runChromium(t, bin, path, "--dump-dom"))
	wall := time.Since(start)
	body := bodyTag.FindString(dom)
	if !strings.Contains(body, `data-ready="1"`) || strings.Contains(body, "data-error") {
		t.Fatalf("the page's script did not finish cleanly: %s", body)
	}
	ms := regexp.MustCompile(`data-ready-ms="(\d+)"`).FindStringSubmatch(body)
	if ms == nil {
		t.Fatalf("no data-ready-ms in %s", body)
	}
	ready, _ := strconv.Atoi(ms[1])
	t.Logf("20 000 nodes: %d bytes; ready %d ms after navigation (chromium run %v)", page.Len(), ready, wall.Round(time.Millisecond))
	if ready > 15000 {
		t.Errorf("page took %d ms to become ready, want under 15 s", ready)
	}
	if !strings.Contains(dom, "showing 500 of 20000 rows") {
		t.Errorf("the node table does not show its first page")
	}
}

// TestBrowserFixtures loads every fixture's page in one browser run, each
// in an iframe of a parent page that collects how each one's script ended.
func TestBrowserFixtures(t *testing.T) {
	bin := chromium(t)
	var parent strings.Builder
	parent.WriteString("<!DOCTYPE html><html><body>")
	for _, name := range fixtures {
		var page bytes.Buffer
		if err := auditHTML(&page, loadReport(t, name)); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&parent, `<iframe data-name="%s" srcdoc="%s"></iframe>`, name, html.EscapeString(page.String()))
	}
	parent.WriteString(`<script>
window.addEventListener("load", function () {
  var out = [];
  document.querySelectorAll("iframe").forEach(function (f) {
    var b = f.contentDocument.body;
    out.push(f.getAttribute("data-name") + "=" + (b.getAttribute("data-error") || b.getAttribute("data-ready") || "none") +
      "/" + f.contentDocument.querySelectorAll("#nodes tbody tr").length);
  });
  document.body.setAttribute("data-results", out.join(" "));
});
</script></body></html>`)
	path := filepath.Join(t.TempDir(), "all.html")
	if err := os.WriteFile(path, []byte(parent.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(runChromium(t, bin, path, "--dump-dom"))
	m := regexp.MustCompile(`data-results="([^"]*)"`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the parent page collected nothing: %s", bodyTag.FindString(dom))
	}
	got := map[string]string{}
	for _, kv := range strings.Fields(html.UnescapeString(m[1])) {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	for _, name := range fixtures {
		r := loadReport(t, name)
		rows := 0
		for _, n := range r.Nodes {
			rows += max(len(n.Outputs), 1)
		}
		if want := fmt.Sprintf("1/%d", rows); got[name] != want {
			t.Errorf("%s: script ended %q, want ready with %d table rows", name, got[name], rows)
		}
	}
}
