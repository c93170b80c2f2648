package checks

import (
	"errors"
	"strings"
	"testing"
)

// TestRunAnalyzers: a disabled analyzer and one that does not apply to the
// policy never run; the others run in order and their findings keep it.
func TestRunAnalyzers(t *testing.T) {
	ran := map[string]bool{}
	mk := func(id string, policies ...string) *Analyzer[string] {
		c := &Check{ID: id, Title: "t", Doc: "d", Policies: policies}
		return &Analyzer[string]{Check: c, Run: func(facts string) ([]Finding, error) {
			ran[id] = true
			return []Finding{c.Finding(facts)}, nil
		}}
	}
	as := []*Analyzer[string]{mk("FP2001"), mk("FP3001"), mk("FP4005", "half"), mk("FP4004")}
	sel := Selection{rules: []selectRule{{pattern: "all", enable: true}, {pattern: "FP3*", enable: false}}}
	got, err := RunAnalyzers(as, "facts", sel, "autocast-fp16")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, f := range got {
		ids = append(ids, f.Check)
		if f.Message != "facts" {
			t.Errorf("%s: message %q, want the facts passed through", f.Check, f.Message)
		}
	}
	if strings.Join(ids, ",") != "FP2001,FP4004" {
		t.Errorf("findings %v, want FP2001,FP4004", ids)
	}
	if ran["FP3001"] || ran["FP4005"] {
		t.Errorf("a disabled or inapplicable analyzer ran: %v", ran)
	}
	// A requirement the facts do not meet keeps its analyzer from running.
	long := &Requirement[string]{Name: "long facts", Met: func(f string) bool { return len(f) > 5 }}
	needy := mk("FP2003")
	needy.Requires = []*Requirement[string]{long}
	for facts, want := range map[string]string{"facts": "", "more facts": "FP2003"} {
		ran["FP2003"] = false
		got, err := RunAnalyzers([]*Analyzer[string]{needy}, facts, Selection{}, "half")
		if err != nil {
			t.Fatal(err)
		}
		if (len(got) == 1) != (want != "") || ran["FP2003"] != (want != "") {
			t.Errorf("facts %q: findings %v, ran %v; want the analyzer to run only when %s holds", facts, got, ran["FP2003"], long.Name)
		}
		if ok, missing := needy.Ready(facts); ok != (want != "") || (!ok && missing != "long facts") {
			t.Errorf("facts %q: Ready = %v, %q", facts, ok, missing)
		}
	}
	none, err := RunAnalyzers([]*Analyzer[string]{}, "", Selection{}, "half")
	if err != nil || none == nil || len(none) != 0 {
		t.Errorf("no analyzers: %#v, %v; want an empty list", none, err)
	}
	boom := &Analyzer[string]{Check: &Check{ID: "FP1001"}, Run: func(string) ([]Finding, error) { return nil, errors.New("unreadable") }}
	if _, err := RunAnalyzers([]*Analyzer[string]{boom}, "", Selection{}, "half"); err == nil || !strings.Contains(err.Error(), "FP1001: unreadable") {
		t.Errorf("error %v, want it wrapped with the check ID", err)
	}
}
