package render

import (
	"bytes"
	"flag"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	goldenfile "fp16audit/internal/golden"
	"fp16audit/internal/render/audit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ and the screenshots docs/demo-report.png and docs/scales-report.png")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, filepath.Join("testdata", name), got, *update, "go test ./internal/render -update")
}

func TestOnlyFlagged(t *testing.T) {
	for _, name := range goldenNames(t) {
		r := loadReport(t, name)
		var b bytes.Buffer
		if err := Render(&b, r, "text", Options{Text: TextOptions{OnlyFlagged: true}}); err != nil {
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
	// A line's columns leave out the colour escapes.
	escape := regexp.MustCompile("\x1b\\[[^m]*m")
	stripANSI := func(s string) string { return escape.ReplaceAllString(s, "") }
	r := syntheticReport(200)
	r.Nodes[3].Name = strings.Repeat("/encoder/block", 20) + "/MatMul"
	for _, width := range []int{80, 100, 120, 160, 240} {
		for _, color := range []bool{false, true} {
			var b bytes.Buffer
			if err := Render(&b, r, "text", Options{Text: TextOptions{Width: width, Color: color}}); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(b.String(), "\x1b[") != color {
				t.Errorf("width %d: colour escapes present = %v, want %v", width, !color, color)
			}
			for i, line := range strings.Split(b.String(), "\n") {
				if n := utf8.RuneCountInString(stripANSI(line)); n > width {
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

func TestRenderUnknownFormat(t *testing.T) {
	err := Render(&bytes.Buffer{}, loadReport(t, "healthy"), "sarif2", Options{})
	if err == nil || !strings.Contains(err.Error(), "markdown") {
		t.Errorf("Render(sarif2) = %v, want an error listing the formats", err)
	}
}

func TestMarkdownLimit(t *testing.T) {
	var b bytes.Buffer
	if err := Render(&b, syntheticReport(20000), "markdown", Options{}); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if len(md) > audit.MarkdownLimit {
		t.Errorf("markdown is %d bytes, want at most %d", len(md), audit.MarkdownLimit)
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
	if err := Render(&b, r, "markdown", Options{}); err != nil {
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
	r := loadReport(t, "demo_cnn_raw")
	r.Nodes[2].Name = `</script><script>alert(1)</script>`
	r.Nodes[3].Module = `<img src=x onerror=alert(2)>`
	r.VerdictText += ` <b>bold</b>`
	var b bytes.Buffer
	if err := Render(&b, r, "html", Options{}); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, bad := range []string{"alert(1)</script>", "<img", "<b>bold</b>"} {
		if strings.Contains(page, bad) {
			t.Errorf("page holds %q", bad)
		}
	}
	b.Reset()
	if err := Render(&b, loadReport(t, "demo_cnn_raw"), "html", Options{}); err != nil {
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
	if err := Render(&b, r, "html", Options{}); err != nil {
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
		if err := Render(&buf, r, "html", Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len()), "bytes/page")
}
