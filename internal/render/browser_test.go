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
	"slices"
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
	if err := Render(&page, loadReport(t, "demo_cnn_raw"), "html", Options{}); err != nil {
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
		"is not normalized; with it standardized the fp16 pass is clean",
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
		r := loadReport(t, "demo_cnn_raw")
		r.Tool.Version = report.Version
		page.Reset()
		if err := Render(&page, r, "html", Options{}); err != nil {
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
	if err := Render(&page, syntheticReport(20000), "html", Options{}); err != nil {
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
	for _, name := range goldenNames(t) {
		var page bytes.Buffer
		if err := Render(&page, loadReport(t, name), "html", Options{}); err != nil {
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
	for _, name := range goldenNames(t) {
		r := loadReport(t, name)
		rows := 0
		// With repeated blocks the rows start closed under a line per run
		// of a block's nodes.
		grouped := len(slices.DeleteFunc(slices.Clone(r.Blocks), func(b report.Block) bool { return !b.Repeated || b.Nodes < 8 })) >= 2
		last := "\x00"
		for _, n := range r.Nodes {
			// The table's rows by default: every node but those computing
			// only from weights and constants, kept when flagged or an
			// origin.
			origin := slices.ContainsFunc(r.Origins, func(o report.Origin) bool { return o.Index >= 0 && o.Index == n.Index })
			switch {
			case n.Constant && !n.Flagged && !origin:
			case !grouped:
				rows += max(len(n.Outputs), 1)
			case n.Block != last:
				rows++
				last = n.Block
			}
		}
		if want := fmt.Sprintf("1/%d", rows); got[name] != want {
			t.Errorf("%s: script ended %q, want ready with %d table rows", name, got[name], rows)
		}
	}
}

// tableProbe runs after the page's script: it records which number
// columns of the node table lie outside the table's visible box (as
// "header:right edge"), the viewport's width, and the rows before and
// after the constant-only toggle is clicked.
const tableProbe = `<script>
(function () {
  var box = document.querySelector(".tablebox").getBoundingClientRect(), off = [];
  document.querySelectorAll("#nodes thead th.num").forEach(function (th) {
    var r = th.getBoundingClientRect();
    if (r.left < box.left || r.right > box.right) off.push(th.textContent + ":" + Math.round(r.right));
  });
  var b = document.body, rows = function () { return document.querySelectorAll("#nodes tbody tr").length; };
  b.setAttribute("data-offscreen", off.join("|") || "none");
  b.setAttribute("data-viewport", String(document.documentElement.clientWidth));
  b.setAttribute("data-rows", String(rows()));
  var c = document.getElementById("f-const");
  if (c) { c.click(); b.setAttribute("data-rows-const", String(rows())); }
})();
</script>`

// probePage renders r, appends probe and returns the DOM Chromium dumps
// with a window of the given width.
func probePage(t *testing.T, bin string, r *report.Report, probe string, width int) string {
	t.Helper()
	var page bytes.Buffer
	if err := Render(&page, r, "html", Options{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "probe.html")
	if err := os.WriteFile(path, []byte(strings.Replace(page.String(), "</body>", probe+"</body>", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(runChromium(t, bin, path, "--dump-dom", fmt.Sprintf("--window-size=%d,900", width)))
	body := bodyTag.FindString(dom)
	if !strings.Contains(body, `data-ready="1"`) || strings.Contains(body, "data-error") {
		t.Fatalf("the page's script did not finish cleanly: %s", body)
	}
	return body
}

func attr(body, name string) string {
	m := regexp.MustCompile(name + `="([^"]*)"`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// TestBrowserTableWidth: at 1400 px the node table of a model with long
// node and module names keeps every number column in view, without
// scrolling sideways.
func TestBrowserTableWidth(t *testing.T) {
	bin := chromium(t)
	r := syntheticReport(300)
	for i := range r.Nodes {
		n := &r.Nodes[i]
		n.Name = "/model/encoder/layers." + strconv.Itoa(i) + "/self_attention/attention_dropout_and_projection/" + n.Name
		n.Module = strings.ReplaceAll(strings.TrimPrefix(n.Name, "/"), "/", ".")
		n.OpType = "BatchNormalization"
		n.Outputs[0].Name = n.Name + "/quantized_output_that_is_very_long"
		n.Outputs[0].Shape = "[1024,4096,128,128]"
	}
	body := probePage(t, bin, r, tableProbe, 1400)
	if vp := attr(body, "data-viewport"); vp != "1400" {
		t.Logf("viewport %s px wide", vp)
	}
	if off := attr(body, "data-offscreen"); off != "none" {
		t.Errorf("number columns outside the visible table at 1400 px: %s", off)
	}
}

// TestBrowserConstantToggle: constant-only rows are hidden until the
// toggle is clicked.
func TestBrowserConstantToggle(t *testing.T) {
	bin := chromium(t)
	body := probePage(t, bin, schemaReport(), tableProbe, 1400)
	if got, want := attr(body, "data-rows")+"→"+attr(body, "data-rows-const"), "5→6"; got != want {
		t.Errorf("node table rows before→after the constant-only toggle: %s, want %s", got, want)
	}
}

// blockProbe runs after the page's script: it opens the block line of
// model.layers.1 and records the rows before and after, the main chart's
// axis top and the points of the growth plot.
const blockProbe = `<script>
(function () {
  var b = document.body, rows = function () { return document.querySelectorAll("#nodes tbody tr").length; };
  b.setAttribute("data-closed", String(rows()));
  var line = Array.prototype.filter.call(document.querySelectorAll("#nodes tr.blk"), function (tr) { return tr.textContent.indexOf("model.layers.1 ") >= 0; })[0];
  line.click();
  b.setAttribute("data-opened", String(rows()));
  b.setAttribute("data-top", document.getElementById("chart").getAttribute("data-top"));
  b.setAttribute("data-growth", String(document.querySelectorAll("#growth .xl").length));
})();
</script>`

// TestBrowserBlocks: a transformer's report in headless Chromium: the node
// table starts closed by block and a click opens one; the chart's axis
// stays near fp16's range though a mask constant of -3.4e38 is held in
// fp16 (before, it reached 2^132); the growth plot has a point per layer.
func TestBrowserBlocks(t *testing.T) {
	bin := chromium(t)
	r := loadReport(t, "torch_llama_bf16_checkpoint.policy-half")
	var page bytes.Buffer
	if err := Render(&page, r, "html", Options{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "blocks.html")
	if err := os.WriteFile(path, []byte(strings.Replace(page.String(), "</body>", blockProbe+"</body>", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(runChromium(t, bin, path, "--dump-dom"))
	attr := func(name string) int {
		m := regexp.MustCompile(name + `="([^"]*)"`).FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no %s in %s", name, bodyTag.FindString(dom))
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatalf("%s=%q", name, m[1])
		}
		return int(v)
	}
	shown := 0
	for _, n := range r.Nodes {
		if n.Block == "model.layers.1" && (!n.Constant || n.Flagged) {
			shown += max(len(n.Outputs), 1)
		}
	}
	closed, opened := attr("data-closed"), attr("data-opened")
	if closed > 12 || opened != closed+shown {
		t.Errorf("node table: %d rows closed, %d with model.layers.1 open; want a few block lines, then %d more", closed, opened, shown)
	}
	if top := attr("data-top"); top > 40 {
		t.Errorf("the chart's axis reaches 2^%d: a constant held in fp16 sets it", top)
	}
	if n := attr("data-growth"); n != 2 {
		t.Errorf("growth plot labels %d blocks, want the 2 layers", n)
	}
}
