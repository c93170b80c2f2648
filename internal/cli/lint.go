package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/lint"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/render"
	"fp16audit/report"
)

// lintFormats are the --format values of lint.
var lintFormats = render.Formats(report.KindLint)

// lintOptions are the flags of `fp16audit lint`.
type lintOptions struct {
	policy, checks, failOn string
	format, output         string
}

func cmdLint(args []string, stdout, stderr io.Writer) int {
	var o lintOptions
	fs := newFlagSet("lint", "fp16audit lint MODEL... [flags]",
		"  fp16audit lint models/*.onnx --policy half --checks all,-FP4002 --format sarif --output fp16audit.sarif", stdout)
	fs.StringVar(&o.policy, "policy", precision.DefaultPolicy, "precision policy: "+policyNames())
	fs.StringVar(&o.checks, "checks", "all", "checks to run: comma-separated IDs, prefixes such as FP4* and all, each optionally negated with -; later entries win")
	// error, as for run and scales: a warning is what a graph cannot tell
	// (a torch.finfo(x.dtype).min an fp32 export writes as float32's,
	// a BatchNorm folded away), shown but no reason to refuse a commit of
	// the fix FP4004 itself recommends; --fail-on warning is the strict gate
	fs.StringVar(&o.failOn, "fail-on", "error", "exit 1 when a finding reaches this severity: error, warning or never")
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
	var results []report.LintModel
	for _, path := range fs.Args() {
		c, err := configs.forModel(path)
		if err != nil {
			fmt.Fprintf(stderr, "fp16audit lint: %v\n", err)
			return exitUsage
		}
		s := settings{policy: o.policy, checks: o.checks, failOn: o.failOn}.resolve(fs, c, path)
		res := report.LintModel{Path: path, Config: relPath(s.config), Policy: s.policy, Checks: s.checks, FailOn: s.failOn, Findings: []checks.Finding{}}
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
	doc := &report.LintReport{Schema: report.LintSchema, Tool: report.LintTool{Name: "fp16audit", Version: report.Version}, Models: results}
	if doc.Models == nil {
		doc.Models = []report.LintModel{}
	}
	for _, a := range lint.Analyzers() {
		doc.Rules = append(doc.Rules, a.Check)
	}
	if err := writeDocument(doc, o.format, o.output, render.Options{}, stdout); err != nil {
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
	// the ops inside local functions are placed one by one, as the audit
	// places them
	if err := m.Flatten(); err != nil {
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
