package audit

import (
	"strings"
	"testing"

	"fp16audit/report"
)

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

// TestAgreementRoles: an output a selection chose says how many of fp32's
// picks the pass kept and is not marked bad, however few; a ranked value
// is named as one and judged as usual.
func TestAgreementRoles(t *testing.T) {
	worst := 0.012
	r := &report.Report{OutputAgreement: []report.OutputAgreement{
		{Pass: "fp16", Output: "boxes", Outcome: report.OutputChosen, Role: report.RoleChosen, KeptItems: 300, CommonItems: 12},
		{Pass: "fp16", Output: "/Gather_6_output_0", Outcome: report.OutputAgrees, Role: report.RoleRanked, WorstRelErr: &worst, RelErr: &worst, Tolerance: 0.05},
	}}
	rows := agreements(r)
	if rows[0].Bad || !rows[0].Chosen || !strings.Contains(rows[0].Worst, "12 of fp32's 300 kept items") {
		t.Errorf("chosen row %+v", rows[0])
	}
	if rows[1].Bad || !strings.Contains(rows[1].Output, "ranked by a selection") {
		t.Errorf("ranked row %+v", rows[1])
	}
	var b strings.Builder
	if err := Text(&b, r, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "fp16 boxes chosen: 12 of fp32's 300 kept items kept too") {
		t.Errorf("text report:\n%s", b.String())
	}
}

// TestOriginAtInput: an origin of an emulated pass at a graph input (the
// half policy holds the batch in fp16, where its values beyond 65504 are
// Inf) reads as the input, in every format, not as an empty node.
func TestOriginAtInput(t *testing.T) {
	r := &report.Report{Verdict: report.VerdictUnnormalized, VerdictText: "the input is not normalized",
		Inputs:  []report.InputReport{{ValueReport: report.ValueReport{Name: "waveform", Shape: "[4,16000]"}}},
		Origins: []report.Origin{{Pass: "fp16", Cause: report.CauseOverflow, Index: -1, Input: "waveform", Value: "waveform", Precision: "fp16", NonFinite: 12, FP32MaxAbs: 9e4}}}
	var text, md, html strings.Builder
	if err := Text(&text, r, TextOptions{Width: 200}); err != nil {
		t.Fatal(err)
	}
	if err := Markdown(&md, r); err != nil {
		t.Fatal(err)
	}
	if err := HTML(&html, r); err != nil {
		t.Fatal(err)
	}
	if s := text.String(); !strings.Contains(s, `origin (fp16 pass): input "waveform"`) || !strings.Contains(s, "held in fp16") || strings.Contains(s, " (, module") {
		t.Errorf("text origin line:\n%s", s)
	}
	if s := md.String(); !strings.Contains(s, "| fp16 | input `waveform` |") {
		t.Errorf("markdown origin row:\n%s", s)
	}
	if s := html.String(); !strings.Contains(s, "<dt>input</dt><dd><code>waveform</code>") {
		t.Errorf("html origin:\n%s", s)
	}
}
