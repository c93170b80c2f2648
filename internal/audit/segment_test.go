package audit_test

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/audit"
	"fp16audit/report"
)

var segmentsNote = regexp.MustCompile(`run in (\d+) segments`)

// comparable returns the report as JSON without what may differ between
// two runs of the same audit: the elapsed time and the memory note.
func comparable(t *testing.T, r *report.Report) (string, string) {
	t.Helper()
	c := *r
	c.Tool.ElapsedSecs = 0
	c.Notes = nil
	var memNote string
	for _, n := range r.Notes {
		if strings.HasPrefix(n, "memory estimate:") {
			memNote = n
			continue
		}
		c.Notes = append(c.Notes, n)
	}
	b, err := json.MarshalIndent(&c, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b), memNote
}

// TestSegmentedEqualsUnsegmented audits every fixture batch and PyTorch
// export twice, unsegmented and under a budget so small that every
// possible cut is taken, and compares the full reports: every statistic,
// difference, finding, origin, fix and verdict.
func TestSegmentedEqualsUnsegmented(t *testing.T) {
	type tc struct{ model, batch string }
	var cases []tc
	for _, f := range fixtures.All() {
		for _, b := range f.Batches {
			cases = append(cases, tc{f.Name + ".onnx", b.Name + ".npy"})
		}
	}
	for _, te := range fixtures.TorchExports() {
		cases = append(cases, tc{filepath.Base(te.Model), filepath.Base(te.Batch)})
	}
	for _, c := range cases {
		t.Run(c.model+"/"+c.batch, func(t *testing.T) {
			cfg := audit.Config{ModelPath: filepath.Join(fixtureDir, "models", c.model), Inputs: []string{batchPath(c.batch)}}
			whole, wholeNote := comparable(t, runConfig(t, cfg))
			if segmentsNote.MatchString(wholeNote) {
				t.Fatalf("default budget segmented a fixture: %s", wholeNote)
			}
			cfg.MaxMemory = 1
			seg, segNote := comparable(t, runConfig(t, cfg))
			m := segmentsNote.FindStringSubmatch(segNote)
			if m == nil {
				t.Fatalf("a 1-byte budget did not segment: %s", segNote)
			}
			t.Log(segNote)
			if n, _ := strconv.Atoi(m[1]); n < 3 {
				t.Errorf("only %d segments: %s", n, segNote)
			}
			if seg != whole {
				t.Errorf("segmented report differs from unsegmented:\n%s", firstDiff(whole, seg))
			}
		})
	}
}

// firstDiff shows the first differing line of two texts with context.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			lo := max(0, i-5)
			return "unsegmented:\n" + strings.Join(al[lo:min(i+3, len(al))], "\n") +
				"\nsegmented:\n" + strings.Join(bl[lo:min(i+3, len(bl))], "\n")
		}
	}
	return "lengths differ"
}
