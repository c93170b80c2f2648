// Package checks is the identity of every finding fp16audit reports: a
// stable ID (never reused; FP1xxx input data, FP2xxx forward overflow,
// FP3xxx underflow, FP4xxx static graph hazards, FP5xxx training logs,
// FP6xxx the training audit: train-mode forward and backward pass), a
// short lowercase title, the documentation `fp16audit explain` prints and a
// default severity. The dynamic audit, the static lint and the training-log
// diagnosis declare their checks here; findings carry the ID.
package checks

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Severity orders findings; --fail-on compares against it.
type Severity int

// Severities, lowest first.
const (
	SevInfo Severity = iota
	SevWarning
	SevError
)

var severityNames = [...]string{"info", "warning", "error"}

func (s Severity) String() string { return severityNames[s] }

// MarshalText writes the severity's name.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a severity name.
func (s *Severity) UnmarshalText(b []byte) error {
	for i, n := range severityNames {
		if n == string(b) {
			*s = Severity(i)
			return nil
		}
	}
	return fmt.Errorf("unknown severity %q (want info, warning or error)", b)
}

// Finding is one fact a check established about the model or its inputs.
type Finding struct {
	Check    string   `json:"check"`
	Severity Severity `json:"severity"`
	Title    string   `json:"title"`
	Message  string   `json:"message"`
	Node     string   `json:"node,omitempty"`
	Module   string   `json:"module,omitempty"`
	Value    string   `json:"value,omitempty"`
	Pass     string   `json:"pass,omitempty"`
}

// Check is the identity of one kind of finding. Doc is written once and
// reused by `fp16audit explain`, the JSON and SARIF outputs.
type Check struct {
	ID       string
	Title    string
	Severity Severity
	Doc      string
	// Policies names the precision policies (ops.Policy names) under which
	// the check can find anything; empty means every policy. A check about
	// values flushing to zero in fp16, for example, has nothing to say
	// under autocast-bf16.
	Policies []string
}

// AppliesTo reports whether the check runs under the named policy.
func (c *Check) AppliesTo(policy string) bool {
	return len(c.Policies) == 0 || slices.Contains(c.Policies, policy)
}

var registry = map[string]*Check{}

// Register adds c to the registry and returns it; a duplicate ID panics at
// start-up, so a clash never ships.
func Register(c *Check) *Check {
	if _, dup := registry[c.ID]; dup {
		panic("checks: duplicate check " + c.ID)
	}
	registry[c.ID] = c
	return c
}

// Lookup returns the check with the given ID.
func Lookup(id string) (*Check, bool) {
	c, ok := registry[id]
	return c, ok
}

// All returns every registered check sorted by ID.
func All() []*Check {
	out := make([]*Check, 0, len(registry))
	for _, c := range registry {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Finding returns a finding of this check with the given message.
func (c *Check) Finding(msg string) Finding {
	return Finding{Check: c.ID, Severity: c.Severity, Title: c.Title, Message: msg}
}

// Selection is the set of checks a --checks value enables. The zero value
// enables every check.
type Selection struct {
	spec  string
	rules []selectRule
	none  bool // the first rule adds checks: start from nothing
}

type selectRule struct {
	pattern string // an ID, a prefix ending in *, or "all"
	enable  bool
}

// ParseSelection reads a --checks value: a comma-separated list of entries,
// each "all", a check ID ("FP4001"), or an ID prefix ending in "*"
// ("FP3*"), optionally preceded by "-" to disable instead of enable. Later
// entries win over earlier ones. A list whose first entry enables starts
// from no checks ("FP4*" selects only the FP4xxx checks); a list whose first
// entry disables starts from all of them ("-FP3*" is "all,-FP3*"). An
// exact ID must be registered; a prefix may match nothing yet.
func ParseSelection(spec string) (Selection, error) {
	sel := Selection{spec: spec}
	for i, e := range strings.Split(spec, ",") {
		e = strings.TrimSpace(e)
		enable := !strings.HasPrefix(e, "-")
		p := strings.TrimPrefix(e, "-")
		switch {
		case p == "":
			return Selection{}, fmt.Errorf("checks %q: empty entry; want a comma-separated list such as all,-FP3*,FP3001", spec)
		case p == "all", strings.HasSuffix(p, "*") && validPrefix(strings.TrimSuffix(p, "*")):
		case validID(p):
			if _, ok := registry[p]; !ok {
				return Selection{}, fmt.Errorf("checks %q: no check %s; run 'fp16audit checks' for the list", spec, p)
			}
		default:
			return Selection{}, fmt.Errorf("checks %q: entry %q is not all, a check ID such as FP4001 or a prefix such as FP3*", spec, e)
		}
		if i == 0 {
			sel.none = enable
		}
		sel.rules = append(sel.rules, selectRule{pattern: p, enable: enable})
	}
	return sel, nil
}

// Enabled reports whether the check with the given ID is selected.
func (s Selection) Enabled(id string) bool {
	on := !s.none
	for _, r := range s.rules {
		if r.matches(id) {
			on = r.enable
		}
	}
	return on
}

// String returns the --checks value the selection was parsed from, or
// "all" for the zero value.
func (s Selection) String() string {
	if s.spec == "" {
		return "all"
	}
	return s.spec
}

func (r selectRule) matches(id string) bool {
	switch {
	case r.pattern == "all":
		return true
	case strings.HasSuffix(r.pattern, "*"):
		return strings.HasPrefix(id, strings.TrimSuffix(r.pattern, "*"))
	}
	return r.pattern == id
}

// validID reports whether id has the form of a check ID: FP and four
// digits, the first 1 to 6.
func validID(id string) bool {
	if len(id) != 6 || !strings.HasPrefix(id, "FP") || id[2] < '1' || id[2] > '6' {
		return false
	}
	for _, c := range id[3:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validPrefix reports whether p can start a check ID ("", "F", "FP",
// "FP4", "FP40").
func validPrefix(p string) bool {
	if len(p) > 5 {
		return false
	}
	return validID(p + "FP1000"[len(p):])
}

// Validate checks a declaration against the registry's conventions: an ID
// of the form FP1xxx to FP6xxx, a short lowercase title without a trailing
// period, and a doc text. The registry test runs it over every check.
func Validate(c *Check) error {
	switch {
	case !validID(c.ID):
		return fmt.Errorf("check %q: want an ID FP1000 to FP6999", c.ID)
	case c.Title == "" || c.Title != strings.ToLower(c.Title) || strings.HasSuffix(c.Title, "."):
		return fmt.Errorf("check %s: title %q: want a lowercase phrase without a trailing period", c.ID, c.Title)
	case strings.TrimSpace(c.Doc) == "":
		return fmt.Errorf("check %s: no doc text", c.ID)
	case c.Severity < SevInfo || c.Severity > SevError:
		return fmt.Errorf("check %s: severity %d out of range", c.ID, c.Severity)
	}
	return nil
}
