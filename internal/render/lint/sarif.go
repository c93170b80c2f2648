package lint

import (
	"encoding/json"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"unicode"

	"fp16audit/checks"
)

// SARIF 2.1.0 (OASIS), the format code-scanning services read: GitHub code
// scanning, GitLab, Azure DevOps and the SARIF viewers of editors.
const (
	sarifVersion = "2.1.0"
	sarifSchema  = "https://json.schemastore.org/sarif-2.1.0.json"
)

// sarifInput is what a SARIF log reports: the tool, the checks it ran (the
// log's rules) and, per model file, its findings or why it could not be
// examined. It does not depend on how the findings were made, so the static
// lint and the dynamic audit render through the same code.
type sarifInput struct {
	// Tool and Version name the program ("fp16audit", "0.2.0").
	Tool    string
	Version string
	// Rules are the checks that ran, in the order the log lists them.
	Rules []*checks.Check
	// Models are the files examined, in order.
	Models []sarifModel
}

// sarifModel is one model file and what was found in it.
type sarifModel struct {
	// Path is the model file as the user named it; a relative path becomes
	// a relative URI (resolved against the folder the tool ran in), an
	// absolute one a file:// URI.
	Path     string
	Findings []checks.Finding
	// Err, when set, says why the model could not be examined; it becomes
	// an error notification of the invocation, not a result.
	Err string
}

// The SARIF object model, limited to the properties fp16audit writes.
type (
	sarifLog struct {
		Version string     `json:"version"`
		Schema  string     `json:"$schema"`
		Runs    []sarifRun `json:"runs"`
	}
	sarifRun struct {
		Tool        sarifTool         `json:"tool"`
		Invocations []sarifInvocation `json:"invocations"`
		Artifacts   []sarifArtifact   `json:"artifacts,omitempty"`
		Results     []sarifResult     `json:"results"`
	}
	sarifTool struct {
		Driver sarifDriver `json:"driver"`
	}
	sarifDriver struct {
		Name    string      `json:"name"`
		Version string      `json:"version,omitempty"`
		Rules   []sarifRule `json:"rules"`
	}
	sarifRule struct {
		ID                   string       `json:"id"`
		Name                 string       `json:"name"`
		ShortDescription     sarifText    `json:"shortDescription"`
		FullDescription      sarifText    `json:"fullDescription"`
		Help                 sarifText    `json:"help"`
		DefaultConfiguration sarifConfig  `json:"defaultConfiguration"`
		Properties           *sarifPolicy `json:"properties,omitempty"`
	}
	sarifPolicy struct {
		Policies []string `json:"policies"`
	}
	sarifConfig struct {
		Level string `json:"level"`
	}
	sarifText struct {
		Text string `json:"text"`
	}
	sarifInvocation struct {
		ExecutionSuccessful bool                `json:"executionSuccessful"`
		Notifications       []sarifNotification `json:"toolExecutionNotifications,omitempty"`
	}
	sarifNotification struct {
		Level     string          `json:"level"`
		Message   sarifText       `json:"message"`
		Locations []sarifLocation `json:"locations,omitempty"`
	}
	sarifArtifact struct {
		Location sarifArtifactLocation `json:"location"`
	}
	sarifArtifactLocation struct {
		URI   string `json:"uri"`
		Index *int   `json:"index,omitempty"`
	}
	sarifResult struct {
		RuleID     string          `json:"ruleId"`
		RuleIndex  *int            `json:"ruleIndex,omitempty"`
		Level      string          `json:"level"`
		Message    sarifText       `json:"message"`
		Locations  []sarifLocation `json:"locations"`
		Properties *sarifProps     `json:"properties,omitempty"`
	}
	sarifLocation struct {
		PhysicalLocation sarifPhysical     `json:"physicalLocation"`
		LogicalLocations []sarifLogicalLoc `json:"logicalLocations,omitempty"`
	}
	sarifPhysical struct {
		ArtifactLocation sarifArtifactLocation `json:"artifactLocation"`
	}
	sarifLogicalLoc struct {
		Name               string `json:"name"`
		FullyQualifiedName string `json:"fullyQualifiedName"`
		Kind               string `json:"kind"`
	}
	sarifProps struct {
		Node   string `json:"node,omitempty"`
		Module string `json:"module,omitempty"`
		Value  string `json:"value,omitempty"`
		Pass   string `json:"pass,omitempty"`
	}
)

// writeSARIF writes in as a SARIF 2.1.0 log with one run: the rules come from
// the checks (ID, a PascalCase name derived from the title, the title as
// short description, the doc as full description and help, the default
// severity as level); each finding is a result located in its model file,
// with the node as a logical location whose fully qualified name is the
// PyTorch module path. Models that could not be examined make the
// invocation unsuccessful and appear as error notifications.
func writeSARIF(w io.Writer, in sarifInput) error {
	run := sarifRun{
		Tool:    sarifTool{Driver: sarifDriver{Name: in.Tool, Version: in.Version, Rules: []sarifRule{}}},
		Results: []sarifResult{},
	}
	ruleIndex := map[string]int{}
	for i, c := range in.Rules {
		ruleIndex[c.ID] = i
		r := sarifRule{
			ID: c.ID, Name: ruleName(c.Title),
			ShortDescription:     sarifText{c.Title},
			FullDescription:      sarifText{c.Doc},
			Help:                 sarifText{c.Doc},
			DefaultConfiguration: sarifConfig{sarifLevel(c.Severity)},
		}
		if len(c.Policies) > 0 {
			r.Properties = &sarifPolicy{Policies: c.Policies}
		}
		run.Tool.Driver.Rules = append(run.Tool.Driver.Rules, r)
	}
	inv := sarifInvocation{ExecutionSuccessful: true}
	for ai, m := range in.Models {
		loc := sarifArtifactLocation{URI: fileURI(m.Path), Index: ptr(ai)}
		run.Artifacts = append(run.Artifacts, sarifArtifact{Location: sarifArtifactLocation{URI: loc.URI}})
		if m.Err != "" {
			inv.ExecutionSuccessful = false
			inv.Notifications = append(inv.Notifications, sarifNotification{Level: "error", Message: sarifText{m.Err},
				Locations: []sarifLocation{{PhysicalLocation: sarifPhysical{ArtifactLocation: loc}}}})
			continue
		}
		for _, f := range m.Findings {
			res := sarifResult{RuleID: f.Check, Level: sarifLevel(f.Severity), Message: sarifText{f.Message},
				Locations: []sarifLocation{{PhysicalLocation: sarifPhysical{ArtifactLocation: loc}}}}
			if i, ok := ruleIndex[f.Check]; ok {
				res.RuleIndex = ptr(i)
			}
			if f.Node != "" {
				fq := f.Module
				if fq == "" {
					fq = f.Node
				}
				res.Locations[0].LogicalLocations = []sarifLogicalLoc{{Name: f.Node, FullyQualifiedName: fq, Kind: "member"}}
			}
			if f.Node != "" || f.Value != "" || f.Pass != "" {
				res.Properties = &sarifProps{Node: f.Node, Module: f.Module, Value: f.Value, Pass: f.Pass}
			}
			run.Results = append(run.Results, res)
		}
	}
	run.Invocations = []sarifInvocation{inv}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(sarifLog{Version: sarifVersion, Schema: sarifSchema, Runs: []sarifRun{run}})
}

func ptr(i int) *int { return &i }

// sarifLevel maps a severity to a SARIF level; info is "note".
func sarifLevel(s checks.Severity) string {
	switch s {
	case checks.SevError:
		return "error"
	case checks.SevWarning:
		return "warning"
	}
	return "note"
}

// ruleName turns a title into the identifier-like name SARIF recommends:
// "explicit half cast in the graph" becomes "ExplicitHalfCastInTheGraph".
func ruleName(title string) string {
	var b strings.Builder
	for _, w := range strings.FieldsFunc(title, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		r := []rune(w)
		b.WriteString(strings.ToUpper(string(r[0])) + string(r[1:]))
	}
	return b.String()
}

// fileURI returns the URI of a model path: a relative URI reference with
// forward slashes and percent-escapes for a relative path, a file:// URI for
// an absolute one.
func fileURI(path string) string {
	p := filepath.ToSlash(filepath.Clean(path))
	if filepath.IsAbs(path) {
		if !strings.HasPrefix(p, "/") {
			p = "/" + p // a Windows drive path
		}
		return (&url.URL{Scheme: "file", Path: p}).String()
	}
	return (&url.URL{Path: p}).String()
}
