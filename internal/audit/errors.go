package audit

import "fmt"

// UsageError is a mistake in how fp16audit was called or in the inputs it
// was given (bad flag value, a batch that does not fit the model). The
// command line maps it to exit code 2.
type UsageError struct {
	Msg string
	Err error
}

func (e *UsageError) Error() string {
	if e.Err != nil {
		if e.Msg == "" {
			return e.Err.Error()
		}
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *UsageError) Unwrap() error { return e.Err }

// ModelError means the model could not be loaded or run. The command line
// maps it to exit code 3.
type ModelError struct {
	Path string
	Err  error
}

func (e *ModelError) Error() string { return fmt.Sprintf("%s: %v", e.Path, e.Err) }

func (e *ModelError) Unwrap() error { return e.Err }
