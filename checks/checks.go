// Package checks is the identity of every finding fp16audit reports: a
// stable ID (never reused; FP1xxx input data, FP2xxx forward overflow,
// FP3xxx underflow, FP4xxx static graph hazards, FP5xxx training logs), a
// short lowercase title, the documentation `fp16audit explain` prints and a
// default severity. The dynamic audit, the static lint and the training-log
// diagnosis declare their checks here; findings carry the ID.
package checks

import (
	"fmt"
	"sort"
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
