package checks

import "fmt"

// Analyzer is one check as code: the identity its findings carry, the
// facts it needs beyond its kind's (Requires), and the function that
// finds them in the facts F its driver provides. The static lint and the
// dynamic audit each have a facts type and a list of analyzers; both run
// them with RunAnalyzers, so a check is switched off the same way
// everywhere and never prints. Run returns findings whose Check is
// Check.ID; an error means the facts could not be read, not that
// something was found. Run must not change the facts: every analyzer sees
// the same facts whatever ran before it.
type Analyzer[F any] struct {
	Check *Check
	// Requires lists the facts Run reads beyond those every analyzer of
	// its kind has. The driver runs the analyzer only where every one
	// holds, so Run does not test for them.
	Requires []*Requirement[F]
	Run      func(facts F) ([]Finding, error)
}

// Requirement is a fact some analyzers need, by name (for their
// documentation) and as a test on the facts (for the driver): "the fp32
// pass ran", "the backward ran".
type Requirement[F any] struct {
	Name string
	Met  func(facts F) bool
}

// Ready reports whether every requirement of a holds for facts, and the
// name of the first that does not.
func (a *Analyzer[F]) Ready(facts F) (ok bool, missing string) {
	for _, r := range a.Requires {
		if !r.Met(facts) {
			return false, r.Name
		}
	}
	return true, ""
}

// RunAnalyzers runs, in order, every analyzer that sel enables, that
// applies to the named policy and whose requirements the facts meet, and
// returns their findings in that order. A disabled analyzer does not run
// at all, so it cannot influence what is computed from the findings.
func RunAnalyzers[F any](analyzers []*Analyzer[F], facts F, sel Selection, policy string) ([]Finding, error) {
	out := []Finding{}
	for _, a := range analyzers {
		if !sel.Enabled(a.Check.ID) || !a.Check.AppliesTo(policy) {
			continue
		}
		if ok, _ := a.Ready(facts); !ok {
			continue
		}
		fs, err := a.Run(facts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.Check.ID, err)
		}
		out = append(out, fs...)
	}
	return out, nil
}
