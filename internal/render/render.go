// Package render turns a finished fp16audit document (package report) into
// bytes: text for the terminal, JSON, GitHub-flavoured Markdown, a
// self-contained HTML page and SARIF for code-scanning services. Every
// command — run, lint, scales and render — writes through one Formatter, so
// a format behaves the same whichever command made the document.
//
// This package holds the Formatter registry: which format renders which
// document kind, and JSON for all of them. The renderers live in one
// package per document (audit, lint, scales, replay) and share the helpers of
// package markup. Renderers compute nothing: everything they show is in
// the document. They import only report, checks and markup, and this
// package only them, so rendering a saved report needs neither cgo nor
// ONNX Runtime.
package render

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"fp16audit/internal/render/audit"
	"fp16audit/internal/render/lint"
	"fp16audit/internal/render/replay"
	"fp16audit/internal/render/scales"
	"fp16audit/report"
)

// Options are the rendering choices the command line passes through.
type Options struct {
	Text TextOptions
}

// TextOptions controls the text of an audit report; Color also applies to
// the text of the other documents.
type TextOptions = audit.TextOptions

// Formatter writes documents in one output format.
type Formatter interface {
	// Name is the --format value.
	Name() string
	// Render writes doc. A document kind the format has no rendering for
	// is an error naming the formats that have one.
	Render(w io.Writer, doc report.Document) error
}

// format is one output format: a renderer per document kind it supports.
type format struct {
	name   string
	audit  func(io.Writer, *report.Report, Options) error
	lint   func(io.Writer, *report.LintReport, Options) error
	scales func(io.Writer, *report.ScalesReport, Options) error
	replay func(io.Writer, *report.ReplayReport, Options) error
}

var formats = []*format{
	{name: "text",
		audit:  func(w io.Writer, r *report.Report, o Options) error { return audit.Text(w, r, o.Text) },
		lint:   func(w io.Writer, r *report.LintReport, _ Options) error { return lint.Text(w, r) },
		scales: func(w io.Writer, r *report.ScalesReport, o Options) error { return scales.Text(w, r, o.Text.Color) },
		replay: func(w io.Writer, r *report.ReplayReport, o Options) error { return replay.Text(w, r, o.Text) }},
	{name: "json",
		audit:  func(w io.Writer, r *report.Report, _ Options) error { return writeJSON(w, r) },
		lint:   func(w io.Writer, r *report.LintReport, _ Options) error { return writeJSON(w, r) },
		scales: func(w io.Writer, r *report.ScalesReport, _ Options) error { return writeJSON(w, r) },
		replay: func(w io.Writer, r *report.ReplayReport, _ Options) error { return writeJSON(w, r) }},
	{name: "markdown",
		audit:  func(w io.Writer, r *report.Report, _ Options) error { return audit.Markdown(w, r) },
		scales: func(w io.Writer, r *report.ScalesReport, _ Options) error { return scales.Markdown(w, r) },
		replay: func(w io.Writer, r *report.ReplayReport, _ Options) error { return replay.Markdown(w, r) }},
	{name: "html",
		audit:  func(w io.Writer, r *report.Report, _ Options) error { return audit.HTML(w, r) },
		scales: func(w io.Writer, r *report.ScalesReport, _ Options) error { return scales.HTML(w, r) },
		replay: func(w io.Writer, r *report.ReplayReport, _ Options) error { return replay.HTML(w, r) }},
	{name: "sarif",
		lint: func(w io.Writer, r *report.LintReport, _ Options) error { return lint.SARIF(w, r) }},
}

func (f *format) supports(k report.Kind) bool {
	switch k {
	case report.KindAudit:
		return f.audit != nil
	case report.KindLint:
		return f.lint != nil
	case report.KindScales:
		return f.scales != nil
	case report.KindReplay:
		return f.replay != nil
	}
	return false
}

// Formats lists the formats that render documents of kind k, in the order
// --help shows them.
func Formats(k report.Kind) []string {
	var names []string
	for _, f := range formats {
		if f.supports(k) {
			names = append(names, f.name)
		}
	}
	return names
}

// New returns the formatter for the named format, or an error listing the
// formats that render documents of kind k.
func New(name string, k report.Kind, opt Options) (Formatter, error) {
	for _, f := range formats {
		if f.name != name {
			continue
		}
		if !f.supports(k) {
			return nil, fmt.Errorf("format %s has no %s rendering (want %s)", name, k, strings.Join(Formats(k), ", "))
		}
		return &formatter{f: f, opt: opt}, nil
	}
	return nil, fmt.Errorf("unknown format %q (want %s)", name, strings.Join(Formats(k), ", "))
}

type formatter struct {
	f   *format
	opt Options
}

func (x *formatter) Name() string { return x.f.name }

func (x *formatter) Render(w io.Writer, doc report.Document) error {
	if !x.f.supports(doc.Kind()) {
		return fmt.Errorf("format %s has no %s rendering (want %s)", x.f.name, doc.Kind(), strings.Join(Formats(doc.Kind()), ", "))
	}
	switch d := doc.(type) {
	case *report.Report:
		return x.f.audit(w, d, x.opt)
	case *report.LintReport:
		return x.f.lint(w, d, x.opt)
	case *report.ScalesReport:
		return x.f.scales(w, d, x.opt)
	case *report.ReplayReport:
		return x.f.replay(w, d, x.opt)
	}
	return fmt.Errorf("render: unknown document type %T", doc)
}

// IsFormat reports whether name is a format for documents of kind k.
func IsFormat(name string, k report.Kind) bool { return slices.Contains(Formats(k), name) }

// writeJSON writes a document as indented JSON in its documented schema.
func writeJSON(w io.Writer, doc any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
