package report

import "fp16audit/checks"

// LintSchema names the JSON shape of LintReport. It changes only when a
// field changes meaning or disappears.
const LintSchema = "fp16audit.lint/v1"

// LintReport is what `fp16audit lint` found in the models it was given.
type LintReport struct {
	Schema string   `json:"schema"`
	Tool   LintTool `json:"tool"`
	// Models holds one entry per model argument, in order.
	Models []LintModel `json:"models"`
	// Rules are the static checks of this build, the rules a SARIF log
	// lists; they are not part of the JSON document.
	Rules []*checks.Check `json:"-"`
}

// LintTool names the program that linted.
type LintTool struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// LintModel is what lint found in one model, under the settings that
// applied to it (flags, or the configuration file found for it).
type LintModel struct {
	Path   string `json:"path"`
	Config string `json:"config,omitempty"`
	Policy string `json:"policy"`
	Checks string `json:"checks"`
	FailOn string `json:"fail_on"`
	// Error says why the model could not be examined; Findings is then
	// empty.
	Error    string           `json:"error,omitempty"`
	Findings []checks.Finding `json:"findings"`
}
