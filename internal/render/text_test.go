package render

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"fp16audit/report"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ and docs/demo-report.png")

// The reports under testdata/ were written once by the command line, e.g.
//
//	fp16audit run fixtures/models/demo_cnn.onnx -i fixtures/batches/demo_cnn_raw.npy --format json -o internal/render/testdata/demo_cnn.json
//
// (demo_fp32 with --policy fp32, torch_resnetish without -i), so these tests
// need no ONNX Runtime. loadReport blanks what changes from run to run.
var fixtures = []string{"demo_cnn", "demo_fp32", "overflowing_op", "oversized_logits", "explicit_half_cast",
	"fp32_broken", "poisoned_input", "healthy", "torch_resnetish", "attention"}

func loadReport(t testing.TB, name string) *report.Report {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var r report.Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	r.Tool.Version, r.Tool.ORTVersion, r.Tool.ElapsedSecs, r.Tool.ORTThreads = "0.0.0-test", "0.0.0-test", 0, 0
	return &r
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/render -update)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) && i < len(wl); i++ {
			if gl[i] != wl[i] {
				t.Fatalf("%s differs at line %d:\ngot:  %q\nwant: %q\n(run go test ./internal/render -update after checking the change)", path, i+1, shortLine(gl[i]), shortLine(wl[i]))
			}
		}
		t.Fatalf("%s differs: got %d lines, want %d (run go test ./internal/render -update after checking the change)", path, len(gl), len(wl))
	}
}

func shortLine(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

func TestGolden(t *testing.T) {
	for _, name := range fixtures {
		r := loadReport(t, name)
		for _, c := range []struct {
			format, ext string
		}{{"text", "txt"}, {"markdown", "md"}, {"html", "html"}} {
			t.Run(name+"."+c.ext, func(t *testing.T) {
				var b bytes.Buffer
				if err := Render(&b, r, c.format, Options{}); err != nil {
					t.Fatal(err)
				}
				golden(t, name+"."+c.ext+".golden", b.Bytes())
			})
		}
	}
}

// TestGoldenTextOptions covers the terminal view: --only-flagged, colour,
// and a table fitted to 80 columns.
func TestGoldenTextOptions(t *testing.T) {
	r := loadReport(t, "demo_cnn")
	for _, c := range []struct {
		name string
		opt  TextOptions
	}{
		{"only-flagged", TextOptions{OnlyFlagged: true}},
		{"color-w100", TextOptions{Color: true, Width: 100}},
		{"w80", TextOptions{Width: 80}},
		{"pass-bf16", TextOptions{Pass: "bf16", OnlyFlagged: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := auditText(&b, r, c.opt); err != nil {
				t.Fatal(err)
			}
			golden(t, "demo_cnn."+c.name+".txt.golden", b.Bytes())
		})
	}
}

func TestOnlyFlagged(t *testing.T) {
	for _, name := range fixtures {
		r := loadReport(t, name)
		var b bytes.Buffer
		if err := auditText(&b, r, TextOptions{OnlyFlagged: true}); err != nil {
			t.Fatal(err)
		}
		table := b.String()[strings.Index(b.String(), "per-node statistics"):]
		rows := strings.Count(table, "\n") - 2 // title and head
		want := 0
		for _, n := range r.Nodes {
			if n.Flagged {
				want += max(len(n.Outputs), 1)
			}
		}
		if rows != want {
			t.Errorf("%s: %d rows with OnlyFlagged, want %d flagged node outputs", name, rows, want)
		}
	}
}

func TestTextFitsWidth(t *testing.T) {
	r := syntheticReport(200)
	r.Nodes[3].Name = strings.Repeat("/encoder/block", 20) + "/MatMul"
	for _, width := range []int{80, 100, 120, 160, 240} {
		for _, color := range []bool{false, true} {
			var b bytes.Buffer
			if err := auditText(&b, r, TextOptions{Width: width, Color: color}); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(b.String(), "\x1b[") != color {
				t.Errorf("width %d: colour escapes present = %v, want %v", width, !color, color)
			}
			for i, line := range strings.Split(b.String(), "\n") {
				if n := runeLen(stripANSI(line)); n > width {
					t.Errorf("width %d colour %v: line %d has %d columns: %q", width, color, i+1, n, stripANSI(line))
					break
				}
			}
			if !strings.Contains(b.String(), "…") {
				t.Errorf("width %d: the long node name was not shortened", width)
			}
		}
	}
}

func TestShorten(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"/conv1/Conv", 20, "/conv1/Conv"},
		{"/layer1/layer1.0/bn1/BatchNormalization", 20, "/layer1/l…malization"},
		{"abcdef", 5, "ab…ef"},
	} {
		if got := shorten(c.in, c.max); got != c.want || runeLen(got) > c.max {
			t.Errorf("shorten(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func TestWrap(t *testing.T) {
	got := wrap("one two three four five six", 14, 2, 4)
	want := "one two\n    three four\n    five six"
	if got != want {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}

func TestRenderUnknownFormat(t *testing.T) {
	err := Render(&bytes.Buffer{}, loadReport(t, "healthy"), "sarif2", Options{})
	if err == nil || !strings.Contains(err.Error(), "markdown") {
		t.Errorf("Render(sarif2) = %v, want an error listing the formats", err)
	}
}

func TestMarkdownLimit(t *testing.T) {
	var b bytes.Buffer
	if err := auditMarkdown(&b, syntheticReport(20000)); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if len(md) > MarkdownLimit {
		t.Errorf("markdown is %d bytes, want at most %d", len(md), MarkdownLimit)
	}
	for _, want := range []string{"flagged node rows cut", "findings cut", "### Flagged nodes (8000 of 20000)", "| 12000 | `/model/layers.857/"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	// Every table row has as many cells as its head.
	re := regexp.MustCompile(`(?:^|[^\\])\|`)
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| # |") {
			if n := len(re.FindAllString(line, -1)); n != 13 {
				t.Errorf("flagged table head has %d pipes: %s", n, line)
			}
		}
		if strings.HasPrefix(line, "| 1") && len(re.FindAllString(line, -1)) != 13 {
			t.Errorf("row has %d pipes, want 13: %s", len(re.FindAllString(line, -1)), line)
			break
		}
	}
}

func TestMarkdownEscapes(t *testing.T) {
	r := loadReport(t, "overflowing_op")
	r.VerdictText = "a | b <script> *c*"
	r.Nodes[0].Name = "/a|b/`x`"
	r.Nodes[0].Flagged = true
	var b bytes.Buffer
	if err := auditMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"<script>", "a | b", "*c*"} {
		if strings.Contains(b.String(), bad) {
			t.Errorf("markdown holds unescaped %q", bad)
		}
	}
}

// TestHTMLSelfContained checks that the page loads nothing and that
// report text cannot break out of its element.
func TestHTMLSelfContained(t *testing.T) {
	r := loadReport(t, "demo_cnn")
	r.Nodes[2].Name = `</script><script>alert(1)</script>`
	r.Nodes[3].Module = `<img src=x onerror=alert(2)>`
	r.VerdictText += ` <b>bold</b>`
	var b bytes.Buffer
	if err := auditHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, bad := range []string{"alert(1)</script>", "<img", "<b>bold</b>"} {
		if strings.Contains(page, bad) {
			t.Errorf("page holds %q", bad)
		}
	}
	b.Reset()
	if err := auditHTML(&b, loadReport(t, "demo_cnn")); err != nil {
		t.Fatal(err)
	}
	page = b.String()
	for _, bad := range []string{"<link", "<img", "<iframe", " src=", "https://", "@import", "url("} {
		if strings.Contains(page, bad) {
			t.Errorf("page loads something: it holds %q", bad)
		}
	}
	if n := strings.Count(page, "http://"); n != strings.Count(page, "http://www.w3.org/2000/svg") {
		t.Errorf("page names a URL other than the SVG namespace")
	}
	if n := strings.Count(page, "<path"); n > 6 {
		t.Errorf("chart has %d paths, want one per series and marker kind", n)
	}
}

// TestHTMLLarge measures the page of a 20 000-node model: the chart stays a
// handful of paths and the page a few megabytes.
func TestHTMLLarge(t *testing.T) {
	r := syntheticReport(20000)
	var b bytes.Buffer
	start := time.Now()
	if err := auditHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	t.Logf("20 000 nodes: %d bytes of HTML in %v", b.Len(), time.Since(start))
	if b.Len() > 8<<20 {
		t.Errorf("page is %d bytes, want under 8 MiB", b.Len())
	}
	if n := strings.Count(b.String(), "<path"); n > 6 {
		t.Errorf("chart has %d paths, want one per series and marker kind", n)
	}
}

func BenchmarkHTML20000(b *testing.B) {
	r := syntheticReport(20000)
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if err := auditHTML(&buf, r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len()), "bytes/page")
}
