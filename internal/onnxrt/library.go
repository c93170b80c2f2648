// Package onnxrt runs ONNX models through ONNX Runtime: it finds and loads
// the shared library once per process, creates sessions from model bytes and
// moves tensor.Tensor values in and out of them.
package onnxrt

import (
	"errors"
	"fmt"
	"fp16audit/internal/ortcapi"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
)

// EnvLibrary is the environment variable that names the ONNX Runtime shared
// library, as --ort-lib does.
const EnvLibrary = "ONNXRUNTIME_LIB"

// libraryNames are the file names looked for in each searched folder, in order.
var libraryNames = []string{"libonnxruntime.so.1", "libonnxruntime.so"}

// systemLibraryDirs are the folders searched after the explicit path, the
// environment and the repository's .ort/ folder.
var systemLibraryDirs = []string{
	"/usr/local/lib",
	"/usr/lib",
	"/usr/lib/x86_64-linux-gnu",
	"/opt/onnxruntime/lib",
}

// ortDir is the folder `make ort` installs the library into, at the root of
// the repository.
const ortDir = ".ort"

// installHint tells a user how to get the library; it ends every
// library-not-found message.
const installHint = "install it with `make ort` (fetches the official linux-x64 build " +
	"from the npm package onnxruntime-node@1.30.0 into .ort/), " +
	"or set " + EnvLibrary + " or --ort-lib to the path of libonnxruntime.so.1"

// LibraryNotFoundError reports that no ONNX Runtime library was found. Tried
// lists every path looked at, in search order.
type LibraryNotFoundError struct {
	Tried []string
}

// Error lists the paths tried and how to install the library.
func (e *LibraryNotFoundError) Error() string {
	var b strings.Builder
	b.WriteString("ONNX Runtime library not found; tried:\n")
	for _, p := range e.Tried {
		b.WriteString("  " + p + "\n")
	}
	b.WriteString(installHint)
	return b.String()
}

// FindLibrary returns the path of the ONNX Runtime shared library. It looks,
// in order, at explicit (the --ort-lib flag; a folder is searched for the
// library names), the ONNXRUNTIME_LIB environment variable (passed over when
// it names no file), the .ort/ folder
// that `make ort` fills (beside the executable or a folder above it, then the
// working directory or a folder above it), and the usual system folders. An
// explicit path that does not exist is an error of its own; otherwise a
// failed search returns a *LibraryNotFoundError.
func FindLibrary(explicit string) (string, error) {
	s := search{env: os.Getenv(EnvLibrary), systemDirs: systemLibraryDirs}
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		s.exeDir = filepath.Dir(exe)
	}
	if wd, err := os.Getwd(); err == nil {
		s.workDir = wd
	}
	return s.find(explicit)
}

// search holds the inputs of a library search, so tests can run it against
// temporary folders.
type search struct {
	env        string
	exeDir     string
	workDir    string
	systemDirs []string
	tried      []string
}

func (s *search) find(explicit string) (string, error) {
	if explicit != "" {
		fi, err := os.Stat(explicit)
		if err != nil {
			return "", fmt.Errorf("ONNX Runtime library %s (--ort-lib): %w; %s", explicit, pathErr(err), installHint)
		}
		if !fi.IsDir() {
			return explicit, nil
		}
		if p, ok := s.inDir(explicit); ok {
			return p, nil
		}
		return "", fmt.Errorf("ONNX Runtime library: folder %s (--ort-lib) holds none of %s; %s",
			explicit, strings.Join(libraryNames, ", "), installHint)
	}
	if s.env != "" {
		if s.isFile(s.env) {
			return s.env, nil
		}
	}
	for _, start := range []string{s.exeDir, s.workDir} {
		if start == "" {
			continue
		}
		for dir := start; ; {
			if p, ok := s.inDir(filepath.Join(dir, ortDir)); ok {
				return p, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	for _, dir := range s.systemDirs {
		if p, ok := s.inDir(dir); ok {
			return p, nil
		}
	}
	return "", &LibraryNotFoundError{Tried: s.tried}
}

// inDir looks for each of libraryNames in dir.
func (s *search) inDir(dir string) (string, bool) {
	for _, name := range libraryNames {
		if p := filepath.Join(dir, name); s.isFile(p) {
			return p, true
		}
	}
	return "", false
}

// isFile records p as tried and reports whether it is a file (or a link to
// one). The two upward walks share folders; each path is tried once.
func (s *search) isFile(p string) bool {
	if slices.Contains(s.tried, p) {
		return false
	}
	s.tried = append(s.tried, p)
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// env is the process's one ONNX Runtime environment.
var env struct {
	mu   sync.Mutex
	path string // the loaded library; empty until Init succeeds
}

// Init loads the ONNX Runtime library at libPath and creates the process's
// environment. An empty libPath means FindLibrary(""). ONNX Runtime allows one
// environment per process: calling Init again with the same library does
// nothing, with another library is an error.
func Init(libPath string) error {
	env.mu.Lock()
	defer env.mu.Unlock()
	if libPath == "" {
		p, err := FindLibrary("")
		if err != nil {
			return err
		}
		libPath = p
	}
	abs, err := filepath.Abs(libPath)
	if err != nil {
		return fmt.Errorf("ONNX Runtime library %s: %w", libPath, err)
	}
	if env.path != "" {
		if sameFile(env.path, abs) {
			return nil
		}
		return fmt.Errorf("ONNX Runtime is already loaded from %s in this process; cannot load %s as well", env.path, abs)
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("ONNX Runtime library %s: %w; %s", abs, pathErr(err), installHint)
	}
	ort.SetSharedLibraryPath(abs)
	// ONNX Runtime's own log lines would interleave with the report on
	// stderr; every error reaches the caller as a value anyway.
	err = ortcapi.WithoutTempFiles(func() error { return ort.InitializeEnvironment(ort.WithLogLevelFatal()) })
	if err != nil {
		return fmt.Errorf("load ONNX Runtime library %s: %v (is it an ONNX Runtime 1.x shared library for this platform?)", abs, innermost(err))
	}
	// Telemetry stays off: fp16audit runs on private models, offline.
	ort.DisableTelemetry()
	env.path = abs
	return nil
}

// pathErr drops the operation and path of a *fs.PathError, which the
// caller's message already names.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// sameFile reports whether a and b name the same file, following links.
func sameFile(a, b string) bool {
	if a == b {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// loadedLibrary returns the path Init loaded, or "" before Init.
func loadedLibrary() string {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.path
}

// Version returns the version string of the loaded ONNX Runtime, such as
// "1.30.0", or "" before Init.
func Version() string {
	if loadedLibrary() == "" {
		return ""
	}
	return ort.GetVersion()
}

// innermost returns the last error of err's wrap chain: onnxruntime_go wraps
// ONNX Runtime's own message in layers of context that mean nothing to a user.
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
