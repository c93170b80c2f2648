// Package golden is the tests' one way to compare output with a file the
// tests themselves write: with update set (each package's -update flag)
// Check rewrites the file, so a golden is always the current code's output
// and the diff under review shows what changed; without it Check fails with
// the lines only one side has.
package golden

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Check compares got with the file at path, or writes got there when
// update is set. hint tells how to regenerate, such as
// "go test ./internal/render -update".
func Check(t testing.TB, path string, got []byte, update bool, hint string) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (%s writes it)", err, hint)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run %s and review the diff):\n%s", path, hint, Diff(string(want), string(got)))
	}
}

// maxDiffLines bounds what Diff lists.
const maxDiffLines = 20

// Diff lists the lines only one side has (at most maxDiffLines of them),
// or says the two differ only in the order of their lines.
func Diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	count := func(s []string) map[string]int {
		m := map[string]int{}
		for _, l := range s {
			m[l]++
		}
		return m
	}
	wm, gm := count(w), count(g)
	var lines []string
	for _, l := range w {
		if gm[l] == 0 && l != "" {
			lines = append(lines, "- missing: "+Short(l))
		} else if gm[l] > 0 {
			gm[l]--
		}
	}
	for _, l := range g {
		if wm[l] == 0 && l != "" {
			lines = append(lines, "+ extra:   "+Short(l))
		} else if wm[l] > 0 {
			wm[l]--
		}
	}
	if len(lines) == 0 {
		return "(same lines, different order)"
	}
	if len(lines) > maxDiffLines {
		lines = append(lines[:maxDiffLines], "(and more)")
	}
	return strings.Join(lines, "\n")
}

// Short cuts a line to 200 bytes, for one-line HTML and JSON goldens.
func Short(l string) string {
	if len(l) > 200 {
		return l[:200] + "…"
	}
	return l
}
