package render

import (
	"io"

	"fp16audit/report"
)

// Render writes doc in the named format: the tests' shorthand for New and
// Render.
func Render(w io.Writer, doc report.Document, name string, opt Options) error {
	f, err := New(name, doc.Kind(), opt)
	if err != nil {
		return err
	}
	return f.Render(w, doc)
}
