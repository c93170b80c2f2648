package checks_test

import (
	"strings"
	"testing"

	"fp16audit/checks"
	_ "fp16audit/internal/diagnose"          // the dynamic checks
	_ "fp16audit/internal/diagnose/training" // the training audit's checks
	_ "fp16audit/internal/lint"              // the static checks
	"fp16audit/internal/precision"
	_ "fp16audit/internal/trainlog" // the training-log checks
)

// TestRegistry validates every check the program declares: IDs of the form
// FP1xxx-FP6xxx and unique (Register panics on a duplicate, so linking both
// packages above already proves it), lowercase titles without a trailing
// period, doc text, and policies that exist.
func TestRegistry(t *testing.T) {
	all := checks.All()
	if len(all) < 10 {
		t.Fatalf("only %d checks registered", len(all))
	}
	seenTitles := map[string]string{}
	for i, c := range all {
		if err := checks.Validate(c); err != nil {
			t.Error(err)
		}
		if i > 0 && all[i-1].ID >= c.ID {
			t.Errorf("All() is not sorted by unique ID at %s", c.ID)
		}
		if prev, dup := seenTitles[c.Title]; dup {
			t.Errorf("checks %s and %s share the title %q", prev, c.ID, c.Title)
		}
		seenTitles[c.Title] = c.ID
		for _, p := range c.Policies {
			if _, err := precision.PolicyByName(p); err != nil {
				t.Errorf("check %s: %v", c.ID, err)
			}
		}
		if got, ok := checks.Lookup(c.ID); !ok || got != c {
			t.Errorf("Lookup(%s) does not return the registered check", c.ID)
		}
	}
}

func TestRegisterDuplicatePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("registering FP4001 twice did not panic")
		}
	}()
	checks.Register(&checks.Check{ID: "FP4001", Title: "again", Doc: "x"})
}

func TestValidate(t *testing.T) {
	for _, c := range []checks.Check{
		{ID: "FP7001", Title: "x", Doc: "d"},
		{ID: "FP401", Title: "x", Doc: "d"},
		{ID: "fp4001", Title: "x", Doc: "d"},
		{ID: "FP4901", Title: "Upper case", Doc: "d"},
		{ID: "FP4901", Title: "trailing period.", Doc: "d"},
		{ID: "FP4901", Title: "", Doc: "d"},
		{ID: "FP4901", Title: "no doc", Doc: "  "},
	} {
		if err := checks.Validate(&c); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if err := checks.Validate(&checks.Check{ID: "FP4901", Title: "fine title", Doc: "d"}); err != nil {
		t.Error(err)
	}
}

func TestAppliesTo(t *testing.T) {
	c := &checks.Check{ID: "FP4901", Policies: []string{"half"}}
	if !c.AppliesTo("half") || c.AppliesTo("autocast-fp16") {
		t.Error("Policies [half]: wrong AppliesTo")
	}
	if !(&checks.Check{}).AppliesTo("fp32") {
		t.Error("empty Policies must apply to every policy")
	}
}

func TestSelection(t *testing.T) {
	ids := []string{"FP1001", "FP2001", "FP3001", "FP4001", "FP4002", "FP4003"}
	for _, tc := range []struct{ spec, want string }{
		{"all", "FP1001 FP2001 FP3001 FP4001 FP4002 FP4003"},
		{"all,-FP3*", "FP1001 FP2001 FP4001 FP4002 FP4003"},
		{"all,-FP3*,FP3001", "FP1001 FP2001 FP3001 FP4001 FP4002 FP4003"},
		{"all,-FP4*,FP4001", "FP1001 FP2001 FP3001 FP4001"},
		{"FP4*,-FP4002", "FP4001 FP4003"},
		{"-FP4002", "FP1001 FP2001 FP3001 FP4001 FP4003"},
		{"FP4001,-FP4001", ""},
		{"-FP4001,FP4001", "FP1001 FP2001 FP3001 FP4001 FP4002 FP4003"},
		{"FP2001, FP4001", "FP2001 FP4001"},
		{"*", "FP1001 FP2001 FP3001 FP4001 FP4002 FP4003"},
		{"all,-*", ""},
		{"FP5*", ""},
	} {
		sel, err := checks.ParseSelection(tc.spec)
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		var got []string
		for _, id := range ids {
			if sel.Enabled(id) {
				got = append(got, id)
			}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%q: got %q, want %q", tc.spec, strings.Join(got, " "), tc.want)
		}
		if sel.String() != tc.spec {
			t.Errorf("%q: String() = %q", tc.spec, sel.String())
		}
	}
	var zero checks.Selection
	if !zero.Enabled("FP4001") || zero.String() != "all" {
		t.Error("the zero Selection must enable every check")
	}
}

func TestSelectionErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"":              "empty entry",
		"all,,FP4001":   "empty entry",
		"FP9999":        "not all, a check ID",
		"FP4998":        "no check FP4998",
		"-FP4998":       "no check FP4998",
		"warnings":      "not all, a check ID",
		"FP3*x":         "not all, a check ID",
		"all,-FPX*":     "not all, a check ID",
		"all,FP40011":   "not all, a check ID",
		"all,-FP40011*": "not all, a check ID",
	} {
		_, err := checks.ParseSelection(spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", spec, err, want)
		}
	}
}
