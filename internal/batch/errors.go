package batch

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// LoadError is a failure to read or bind a batch file. Its message starts
// with the path so a user sees which of several -i values is at fault.
type LoadError struct {
	Path string
	Err  error
}

func (e *LoadError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *LoadError) Unwrap() error { return e.Err }

// pathError returns err as a *LoadError for path, dropping the "open path"
// prefix of an fs.PathError so the path is not repeated.
func pathError(path string, err error) error {
	var le *LoadError
	if errors.As(err, &le) {
		return err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path {
		return &LoadError{Path: path, Err: pe.Err}
	}
	return &LoadError{Path: path, Err: err}
}

// openSized opens path for reading and returns its size; errors are
// *LoadError values naming path.
func openSized(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, pathError(path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, &LoadError{Path: path, Err: err}
	}
	return f, st.Size(), nil
}

// stem returns the file name of path without its extension.
func stem(path string) string {
	base := filepath.Base(path)
	return strings.TrimSuffix(base, filepath.Ext(base))
}
