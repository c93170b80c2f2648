package checks

import "fmt"

// Analyzer is one check as code: the identity its findings carry and the
// function that finds them in the facts F its driver provides. The static
// lint and the dynamic audit each have a facts type and a list of
// analyzers; both run them with RunAnalyzers, so a check is switched off
// the same way everywhere and never prints. Run returns findings whose
// Check is Check.ID; an error means the facts could not be read, not that
// something was found.
type Analyzer[F any] struct {
	Check *Check
	// Requires says what Run reads beyond the facts every analyzer has,
	// for the documentation and the drivers' skip rules.
	Requires string
	Run      func(facts F) ([]Finding, error)
}

// RunAnalyzers runs, in order, every analyzer that sel enables and that
// applies to the named policy, and returns their findings in that order.
// A disabled analyzer does not run at all, so it cannot influence what is
// computed from the findings.
func RunAnalyzers[F any](analyzers []*Analyzer[F], facts F, sel Selection, policy string) ([]Finding, error) {
	out := []Finding{}
	for _, a := range analyzers {
		if !sel.Enabled(a.Check.ID) || !a.Check.AppliesTo(policy) {
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
