package render

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"fp16audit/internal/trainlog"
	"fp16audit/internal/trainlog/logfile"
	"fp16audit/report"
)

// The scales goldens under testdata/scales are the Markdown and HTML of the
// diagnoses of internal/trainlog's simulated logs (whose text and JSON
// internal/trainlog keeps), made by trainlog.Analyze in the test, so they
// follow the diagnosis; -update rewrites them.
const scalesGoldens = "testdata/scales"

// scalesCase is a training log and its fp32 baseline ("" for none) under
// internal/trainlog/testdata, or a log made here (make).
type scalesCase struct {
	name, log, baseline string
	make                func() *trainlog.Log
}

var scalesCases = []scalesCase{
	{name: "early_nan", log: "early_nan.json"},
	{name: "early_nan_scales_only", log: "early_nan_scales_only.json"},
	{name: "gradient_overflow_nan", log: "gradient_overflow_nan.json"},
	{name: "forward_overflow_nan", log: "forward_overflow_nan.json"},
	{name: "forward_overflow_nan_losses_only", log: "forward_overflow_nan_losses_only.json"},
	{name: "plateau_underflow", log: "plateau_underflow.json", baseline: "baseline_fp32.json"},
	{name: "fp16_noise", log: "fp16_noise.json", baseline: "baseline_fp32.json"},
	{name: "wasted_warmup", log: "wasted_warmup.json"},
	{name: "healthy", log: "healthy.json"},
	{name: "healthy_losses_only", log: "healthy_losses_only.json"},
	{name: "nan_tail", make: nanTailLog},
}

// nanTailLog is the early NaN of issue 15: 600 steps whose loss is NaN
// from step 5 on, the scale halving on every one of those steps.
func nanTailLog() *trainlog.Log {
	l := &trainlog.Log{Path: "nan_tail.csv", Losses: make([]float64, 600), Scales: make([]float64, 600)}
	scale := 65536.0
	for i := range l.Losses {
		l.Losses[i], l.Scales[i] = 2.7-0.02*float64(i), scale
		if i >= 5 {
			l.Losses[i] = math.NaN()
			scale = max(scale/2, math.SmallestNonzeroFloat32)
			l.Scales[i] = scale
		}
	}
	return l
}

func scalesReport(t testing.TB, c scalesCase) *report.ScalesReport {
	t.Helper()
	read := func(name string) *trainlog.Log {
		l, err := logfile.Read(filepath.Join("..", "trainlog", "testdata", name), logfile.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Path = name // the report names the log as the user gave it
		return l
	}
	var run, base *trainlog.Log
	if c.make != nil {
		run = c.make()
	} else {
		run = read(c.log)
	}
	if c.baseline != "" {
		base = read(c.baseline)
	}
	r, err := trainlog.Analyze(run, base, trainlog.DefaultOptions)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestScalesGolden(t *testing.T) {
	want := map[string]bool{}
	for _, c := range scalesCases {
		r := scalesReport(t, c)
		outs := []struct {
			name string
			opt  Options
			fmt  string
		}{{c.name + ".md.golden", Options{}, "markdown"}, {c.name + ".html.golden", Options{}, "html"}}
		if c.name == "nan_tail" || c.name == "plateau_underflow" {
			outs = append(outs, struct {
				name string
				opt  Options
				fmt  string
			}{c.name + ".txt.golden", Options{}, "text"})
		}
		if c.name == "early_nan" {
			outs = append(outs, struct {
				name string
				opt  Options
				fmt  string
			}{c.name + ".color.txt.golden", Options{Text: TextOptions{Color: true}}, "text"})
		}
		for _, o := range outs {
			want[o.name] = true
			t.Run(o.name, func(t *testing.T) {
				var b bytes.Buffer
				if err := Render(&b, r, o.fmt, o.opt); err != nil {
					t.Fatal(err)
				}
				golden(t, filepath.Join("scales", o.name), b.Bytes())
			})
		}
	}
	if t.Failed() {
		return
	}
	entries, err := os.ReadDir(scalesGoldens)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch {
		case want[e.Name()]:
		case *update:
			if err := os.Remove(filepath.Join(scalesGoldens, e.Name())); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("%s/%s belongs to no scales case (run go test ./internal/render -update)", scalesGoldens, e.Name())
		}
	}
}

// TestScalesNaNTail: a run whose last 595 losses are NaN says so, shows the
// window its final loss really is, and draws no loss range of "0 … 0".
func TestScalesNaNTail(t *testing.T) {
	r := scalesReport(t, scalesCase{make: nanTailLog})
	var b bytes.Buffer
	if err := Render(&b, r, "text", Options{}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"last before the loss went NaN/Inf 2.62 (at step 4)",
		"595 NaN/Inf, the first (NaN) at step 5; every loss from step 5 on is NaN/Inf: the last 595 steps (5–599)",
		"(! holds NaN/Inf: every column does)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"means of 1 steps", "0 … 0"} {
		if strings.Contains(out, bad) {
			t.Errorf("text says %q:\n%s", bad, out)
		}
	}
}

// TestScalesHTMLSelfContained: the page loads nothing, and log text cannot
// break out of its element.
func TestScalesHTMLSelfContained(t *testing.T) {
	r := scalesReport(t, scalesCases[0])
	r.Run.Path = `</script><script>alert(1)</script>`
	r.Notes = append(r.Notes, `<img src=x onerror=alert(2)>`)
	var b bytes.Buffer
	if err := Render(&b, r, "html", Options{}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"alert(1)</script>", "<img"} {
		if strings.Contains(b.String(), bad) {
			t.Errorf("page holds %q", bad)
		}
	}
	b.Reset()
	if err := Render(&b, scalesReport(t, scalesCases[0]), "html", Options{}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"<link", "<img", "<iframe", " src=", "https://", "@import", "url("} {
		if strings.Contains(b.String(), bad) {
			t.Errorf("page loads something: it holds %q", bad)
		}
	}
	if strings.Count(b.String(), "http://") != 0 {
		t.Errorf("page names a URL")
	}
}

// scalesHoverProbe moves the mouse over the middle of the scale chart and
// records the tooltip and whether the other chart's cursor followed.
const scalesHoverProbe = `<script>
(function () {
  var hit = document.querySelector("#scale-chart .hit"), r = hit.getBoundingClientRect();
  hit.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true}));
  var tip = document.getElementById("tip"), cur = document.querySelector("#loss-chart .cursor");
  document.body.setAttribute("data-hover", tip.hidden ? "hidden" : tip.textContent);
  document.body.setAttribute("data-cursor", cur ? cur.getAttribute("visibility") : "none");
})();
</script>`

// TestBrowserScales loads every scales page in headless Chromium (each in
// an iframe of one parent page) and checks that its script finished; then
// the plateau page with a hover. With -update it writes the README's
// screenshot, docs/scales-report.png.
func TestBrowserScales(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	var parent strings.Builder
	parent.WriteString("<!DOCTYPE html><html><body>")
	for _, c := range scalesCases {
		var page bytes.Buffer
		if err := Render(&page, scalesReport(t, c), "html", Options{}); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&parent, `<iframe data-name="%s" srcdoc="%s"></iframe>`, c.name, html.EscapeString(page.String()))
	}
	parent.WriteString(`<script>
window.addEventListener("load", function () {
  var out = [];
  document.querySelectorAll("iframe").forEach(function (f) {
    var d = f.contentDocument, b = d.body;
    out.push(f.getAttribute("data-name") + "=" + (b.getAttribute("data-error") || b.getAttribute("data-ready") || "none") +
      "/" + d.querySelectorAll("svg.schart").length);
  });
  document.body.setAttribute("data-results", out.join(" "));
});
</script></body></html>`)
	all := filepath.Join(dir, "all.html")
	if err := os.WriteFile(all, []byte(parent.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`data-results="([^"]*)"`).FindStringSubmatch(string(runChromium(t, bin, all, "--dump-dom")))
	if m == nil {
		t.Fatal("the parent page collected nothing")
	}
	got := map[string]string{}
	for _, kv := range strings.Fields(html.UnescapeString(m[1])) {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	for _, c := range scalesCases {
		r := scalesReport(t, c)
		charts := 0
		for _, has := range []bool{r.Run.HasScales, r.Run.HasLosses} {
			if has {
				charts++
			}
		}
		if want := fmt.Sprintf("1/%d", charts); got[c.name] != want {
			t.Errorf("%s: script ended %q, want ready with %d charts", c.name, got[c.name], charts)
		}
	}

	plateau := scalesReport(t, scalesCases[5])
	var page bytes.Buffer
	if err := Render(&page, plateau, "html", Options{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "plateau.html")
	if err := os.WriteFile(path, []byte(strings.Replace(page.String(), "</body>", scalesHoverProbe+"</body>", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	dom := string(runChromium(t, bin, path, "--dump-dom", "--window-size=1400,1300"))
	body := bodyTag.FindString(dom)
	if !strings.Contains(body, `data-ready="1"`) || strings.Contains(body, "data-error") {
		t.Fatalf("the page's script did not finish cleanly: %s", body)
	}
	hover := html.UnescapeString(attr(body, "data-hover"))
	for _, want := range []string{"steps", "scale2^", "fp32 loss"} {
		if !strings.Contains(hover, want) {
			t.Errorf("tooltip %q lacks %q", hover, want)
		}
	}
	if c := attr(body, "data-cursor"); c != "visible" {
		t.Errorf("the loss chart's cursor is %q, want visible", c)
	}
	for _, want := range []string{`<span id="verdict-id">plateau-underflow</span>`, `class="skip"`, `class="base"`, "pinned at 2^-27", "compared: +85.3% vs fp32"} {
		if !strings.Contains(html.UnescapeString(dom), want) {
			t.Errorf("the rendered DOM lacks %q", want)
		}
	}

	out := filepath.Join(dir, "scales.png")
	if *update {
		var err error
		if out, err = filepath.Abs(filepath.Join("..", "..", "docs", "scales-report.png")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	runChromium(t, bin, path, "--screenshot="+out, "--window-size=1400,1160", "--hide-scrollbars")
	if fi, err := os.Stat(out); err != nil || fi.Size() < 10000 {
		t.Errorf("screenshot %s missing or blank: %v", out, err)
	}
}
