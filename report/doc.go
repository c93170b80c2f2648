// Package report holds the documents fp16audit's commands produce — the
// audit of `fp16audit run` (Report), the static findings of `fp16audit
// lint` (LintReport) and the training-log diagnosis of `fp16audit scales`
// (ScalesReport), the replay of a captured training step of `fp16audit
// replay` (ReplayReport) — with their JSON schemas. It is a public API: a Go program
// can decode a saved JSON document into these types, and fp16audit's own
// renderers read nothing else. The package computes nothing and imports
// nothing of fp16audit but package checks, so reading or rendering a
// document needs neither cgo nor ONNX Runtime.
//
// Each schema is named by a version string in the document's "schema"
// field (ReportSchema, LintSchema, ScalesSchema). A schema version changes
// only when a field is removed or changes meaning; new fields may appear
// within a version.
package report

// Kind names a document type.
type Kind string

// The documents fp16audit writes.
const (
	KindAudit  Kind = "audit"
	KindLint   Kind = "lint"
	KindScales Kind = "scales"
	KindReplay Kind = "replay"
)

// Document is a finished result of one command, ready to render.
type Document interface {
	// Kind says which command made the document.
	Kind() Kind
}

// Kind returns KindAudit.
func (*Report) Kind() Kind { return KindAudit }

// Kind returns KindLint.
func (*LintReport) Kind() Kind { return KindLint }

// Kind returns KindScales.
func (*ScalesReport) Kind() Kind { return KindScales }

// Version is the version of fp16audit, stamped in every document it writes
// and printed by `fp16audit version`.
const Version = "0.4.0"
