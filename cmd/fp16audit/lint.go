package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"fp16audit/audit"
	"fp16audit/checks"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/report"
)

// lintSchema names the JSON shape of `fp16audit lint --format json`. It
// changes only when a field changes meaning or disappears.
const lintSchema = "fp16audit.lint/v1"

// lintFormats are the --format values of lint.
var lintFormats = []string{"text", "json", "sarif"}

// lintOptions are the flags of `fp16audit lint`.
type lintOptions struct {
	policy, checks, failOn string
	format, output         string
}

// lintResult is what lint found in one model.
type lintResult struct {
	Path     string           `json:"path"`
	Config   string           `json:"config,omitempty"`
	Policy   string           `json:"policy"`
	Checks   string           `json:"checks"`
	FailOn   string           `json:"fail_on"`
	Error    string           `json:"error,omitempty"`
	Findings []checks.Finding `json:"findings"`
}

// lintJSON is the document `lint --format json` writes.
type lintJSON struct {
	Schema string `json:"schema"`
	Tool   struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"tool"`
	Models []lintResult `json:"models"`
}

func cmdLint(args []string, stdout, stderr io.Writer) int {
	var o lintOptions
	fs := newFlagSet("lint", "fp16audit lint MODEL... [flags]",
		"  fp16audit lint models/*.onnx --policy half --checks all,-FP4002 --format sarif --output fp16audit.sarif", stdout)
	fs.StringVar(&o.policy, "policy", precision.DefaultPolicy, "precision policy: "+policyNames())
	fs.StringVar(&o.checks, "checks", "all", "checks to run: comma-separated IDs, prefixes such as FP4* and all, each optionally negated with -; later entries win")
	fs.StringVar(&o.failOn, "fail-on", "warning", "exit 1 when a finding reaches this severity: error, warning or never")
	fs.StringVar(&o.format, "format", "text", "output format: "+strings.Join(lintFormats, ", "))
	fs.StringVarP(&o.output, "output", "o", "", "write the findings to FILE instead of stdout")
	if done, code := parseFlags(fs, args, stderr); done {
		return code
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fp16audit lint: "+format+"\nRun 'fp16audit lint --help' for usage.\n", a...)
		return exitUsage
	}
	if fs.NArg() == 0 {
		return usage("want at least one MODEL argument")
	}
	if _, err := precision.PolicyByName(o.policy); err != nil {
		return usage("--policy: %v", err)
	}
	if _, ok := failOnLevels[o.failOn]; !ok {
		return usage("--fail-on %q: want error, warning or never", o.failOn)
	}
	if !slices.Contains(lintFormats, o.format) {
		return usage("--format %q: want one of %s", o.format, strings.Join(lintFormats, ", "))
	}
	if _, err := checks.ParseSelection(o.checks); err != nil {
		return usage("--checks: %v", err)
	}

	configs := configCache{}
	code := exitOK
	var results []lintResult
	for _, path := range fs.Args() {
		c, err := configs.forModel(path)
		if err != nil {
			fmt.Fprintf(stderr, "fp16audit lint: %v\n", err)
			return exitUsage
		}
		s := settings{policy: o.policy, checks: o.checks, failOn: o.failOn}.resolve(fs, c, path)
		res := lintResult{Path: path, Config: relPath(s.config), Policy: s.policy, Checks: s.checks, FailOn: s.failOn, Findings: []checks.Finding{}}
		findings, err := lintModel(path, s)
		if err != nil {
			fmt.Fprintf(stderr, "fp16audit lint: %v\n", err)
			res.Error = err.Error()
			code = max(code, exitModel)
		} else {
			res.Findings = findings
			if failOn := failOnLevels[s.failOn]; failOn >= 0 && slices.ContainsFunc(findings, func(f checks.Finding) bool { return f.Severity >= failOn }) {
				code = max(code, exitFindings)
			}
		}
		results = append(results, res)
	}
	if err := writeOutput(o.output, stdout, func(w io.Writer) error { return renderLint(w, o.format, results) }); err != nil {
		fmt.Fprintf(stderr, "fp16audit lint: %v\n", err)
		return exitUsage
	}
	return code
}

// lintModel loads and lints one model. Errors are load failures and
// unreadable constants: the model could not be examined.
func lintModel(path string, s settings) ([]checks.Finding, error) {
	m, err := onnx.Load(path)
	if err != nil {
		return nil, err
	}
	sel, err := checks.ParseSelection(s.checks)
	if err != nil {
		return nil, err
	}
	findings, err := lint.Run(m, lint.Options{Policy: s.policy, Checks: sel})
	if err != nil {
		return nil, fmt.Errorf("lint %s: %w", path, err)
	}
	return findings, nil
}

func renderLint(w io.Writer, format string, results []lintResult) error {
	switch format {
	case "json":
		doc := lintJSON{Schema: lintSchema, Models: results}
		doc.Tool.Name, doc.Tool.Version = "fp16audit", audit.Version
		if doc.Models == nil {
			doc.Models = []lintResult{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	case "sarif":
		in := report.SARIFInput{Tool: "fp16audit", Version: audit.Version}
		for _, a := range lint.Analyzers() {
			in.Rules = append(in.Rules, a.Check)
		}
		for _, r := range results {
			in.Models = append(in.Models, report.SARIFModel{Path: r.Path, Findings: r.Findings, Err: r.Error})
		}
		return report.SARIF(w, in)
	}
	return lintText(w, results)
}

// lintText writes one line per finding, "PATH: SEVERITY ID: MESSAGE", as
// compilers do, then a summary line per model.
func lintText(w io.Writer, results []lintResult) error {
	ew := &lintWriter{w: w}
	for _, r := range results {
		if r.Error != "" {
			ew.printf("%s: not linted: %s\n", r.Path, r.Error)
			continue
		}
		var n [3]int
		for _, f := range r.Findings {
			n[f.Severity]++
			ew.printf("%s: %s %s: %s\n", r.Path, f.Severity, f.Check, f.Message)
		}
		ew.printf("%s: %s, %s, %d info (policy %s", r.Path, plural(n[checks.SevError], "error"), plural(n[checks.SevWarning], "warning"), n[checks.SevInfo], r.Policy)
		if r.Checks != "all" {
			ew.printf(", checks %s", r.Checks)
		}
		if r.Config != "" {
			ew.printf(", config %s", r.Config)
		}
		ew.printf(")\n")
	}
	return ew.err
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// relPath shortens an absolute path to one relative to the working
// folder when it lies below it.
func relPath(p string) string {
	if p == "" {
		return p
	}
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

type lintWriter struct {
	w   io.Writer
	err error
}

func (l *lintWriter) printf(format string, a ...any) {
	if l.err == nil {
		_, l.err = fmt.Fprintf(l.w, format, a...)
	}
}
