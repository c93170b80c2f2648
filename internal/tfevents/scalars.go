package tfevents

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Point is one sample of a scalar tag.
type Point struct {
	Step     int64
	WallTime float64
	Value    float64
}

// ReadEvents calls fn for every event of the event file at path, in file
// order, after checking both checksums of its record. The first event must
// decode and, when it has a file_version, it must start with "brain.Event:".
// Errors are *FormatError (with the record's byte offset) or I/O errors,
// all naming path; an error from fn is returned as it is.
func ReadEvents(path string, fn func(Event) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := NewReader(f, path)
	for i := 0; ; i++ {
		off := r.Offset()
		data, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		e, err := DecodeEvent(data)
		if err != nil {
			kind := ErrCorrupt
			if i == 0 {
				kind = ErrNotEventFile
			}
			return &FormatError{Path: path, Offset: off, Kind: kind, Msg: err.Error()}
		}
		if i == 0 && e.FileVersion != "" && !strings.HasPrefix(e.FileVersion, "brain.Event:") {
			return &FormatError{Path: path, Offset: off, Kind: ErrNotEventFile,
				Msg: fmt.Sprintf("file_version %q, want brain.Event:N", e.FileVersion)}
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// ReadScalars reads every scalar of the event file at path, by tag, in file
// order. A scalar is a simple_value or a one-element float tensor (see
// Value.Scalar); tensors of a tag whose plugin metadata names a plugin
// other than "scalars" (histograms, text, hparams...) are left out, and so
// are images, audio and histograms.
//
// Points are returned as the file holds them: a run restarted into the same
// file can repeat steps. When the file ends inside a record (a writer still
// running, or killed mid-write) ReadScalars returns the scalars before it
// together with an error matching ErrTruncated.
func ReadScalars(path string) (map[string][]Point, error) {
	out := map[string][]Point{}
	plugin := map[string]string{} // tag -> plugin from its first metadata
	err := ReadEvents(path, func(e Event) error {
		for _, v := range e.Values {
			if v.Plugin != "" {
				if _, seen := plugin[v.Tag]; !seen {
					plugin[v.Tag] = v.Plugin
				}
			}
			if v.Tensor != nil {
				if p, ok := plugin[v.Tag]; ok && p != "scalars" {
					continue
				}
			}
			x, ok := v.Scalar()
			if !ok {
				continue
			}
			out[v.Tag] = append(out[v.Tag], Point{Step: e.Step, WallTime: e.WallTime, Value: x})
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrTruncated) {
			return out, err
		}
		return nil, err
	}
	return out, nil
}
