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
const installHint = "install it with `pip install onnxruntime` (into the active virtualenv or conda " +
	"environment, or with --user) or with `make ort` (fetches the official linux-x64 build " +
	"from the npm package onnxruntime-node@1.30.0 into .ort/), " +
	"or set " + EnvLibrary + " or --ort-lib to the path of libonnxruntime.so.1"

// APIVersion is the oldest OrtApi version fp16audit can use: onnxruntime_go
// v1.27.0 asks for the version of the header it ships (ORT_API_VERSION 24;
// a test keeps the two equal), ortcapi for 17. OrtApi version N is ONNX
// Runtime 1.N.
const APIVersion = 24

// pythonCapi is where a Python install of ONNX Runtime (pip's onnxruntime
// or onnxruntime-gpu wheel, conda's package) keeps the shared library,
// below a site-packages folder: onnxruntime/capi/libonnxruntime.so.1.30.0.
const pythonCapi = "onnxruntime/capi"

// systemSitePackages are the system's site-packages folders, as patterns:
// Debian's and Ubuntu's dist-packages, then the usual site-packages.
var systemSitePackages = []string{
	"/usr/local/lib/python3*/dist-packages",
	"/usr/lib/python3/dist-packages",
	"/usr/local/lib/python3*/site-packages",
	"/usr/lib/python3*/site-packages",
	"/usr/lib64/python3*/site-packages",
}

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

// Library is an ONNX Runtime shared library the search found.
type Library struct {
	Path string
	// From says where the search found it, for `fp16audit version`: "the
	// --ort-lib flag", "the virtualenv /home/me/venv", ...
	From string
}

// FindLibrary returns the path of the ONNX Runtime shared library Locate
// finds.
func FindLibrary(explicit string) (string, error) {
	l, err := Locate(explicit)
	return l.Path, err
}

// Locate finds the ONNX Runtime shared library. It looks, in order, at
// explicit (the --ort-lib flag; a folder is searched for the library
// names), the ONNXRUNTIME_LIB environment variable (passed over when it
// names no file), the .ort/ folder that `make ort` fills (beside the
// executable or a folder above it, then the working directory or a folder
// above it), the Python installs of ONNX Runtime (the onnxruntime package
// of the active virtualenv ($VIRTUAL_ENV), of the environment the executable
// is installed in (<env>/bin/fp16audit, as the wheel installs it), of the
// active conda environment
// ($CONDA_PREFIX), of the user's site-packages, of the system's), and the
// usual system folders. An explicit path that does not exist is an error
// of its own; otherwise a failed search returns a *LibraryNotFoundError.
func Locate(explicit string) (Library, error) {
	s := search{env: os.Getenv(EnvLibrary), systemDirs: systemLibraryDirs,
		virtualEnv: os.Getenv("VIRTUAL_ENV"), condaPrefix: os.Getenv("CONDA_PREFIX"), systemSites: systemSitePackages}
	s.userBase = os.Getenv("PYTHONUSERBASE")
	if s.userBase == "" {
		if home, err := os.UserHomeDir(); err == nil {
			s.userBase = filepath.Join(home, ".local")
		}
	}
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
	env         string
	exeDir      string
	workDir     string
	virtualEnv  string   // $VIRTUAL_ENV
	condaPrefix string   // $CONDA_PREFIX
	userBase    string   // the user's site base: $PYTHONUSERBASE or ~/.local
	systemSites []string // the system's site-packages folders, as patterns
	systemDirs  []string
	tried       []string
}

func (s *search) find(explicit string) (Library, error) {
	if explicit != "" {
		fi, err := os.Stat(explicit)
		if err != nil {
			return Library{}, fmt.Errorf("ONNX Runtime library %s (--ort-lib): %w; %s", explicit, pathErr(err), installHint)
		}
		if !fi.IsDir() {
			return Library{explicit, "the --ort-lib flag"}, nil
		}
		if p, ok := s.inDir(explicit); ok {
			return Library{p, "the --ort-lib flag"}, nil
		}
		return Library{}, fmt.Errorf("ONNX Runtime library: folder %s (--ort-lib) holds none of %s; %s",
			explicit, strings.Join(libraryNames, ", "), installHint)
	}
	if s.env != "" {
		if s.isFile(s.env) {
			return Library{s.env, "$" + EnvLibrary}, nil
		}
	}
	for _, start := range []string{s.exeDir, s.workDir} {
		if start == "" {
			continue
		}
		for dir := start; ; {
			if p, ok := s.inDir(filepath.Join(dir, ortDir)); ok {
				return Library{p, "the .ort/ folder `make ort` fills"}, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	pythons := []struct{ sites, from string }{
		{prefixSites(s.virtualEnv), "the virtualenv " + s.virtualEnv + " ($VIRTUAL_ENV)"},
		{prefixSites(exeEnv(s.exeDir)), "the Python environment " + exeEnv(s.exeDir) + " the executable is installed in"},
		{prefixSites(s.condaPrefix), "the conda environment " + s.condaPrefix + " ($CONDA_PREFIX)"},
		{prefixSites(s.userBase), "the user's site-packages in " + s.userBase},
	}
	for _, py := range pythons {
		if py.sites == "" {
			continue
		}
		if p, ok := s.inPython(py.sites); ok {
			return Library{p, py.from}, nil
		}
	}
	for _, sites := range s.systemSites {
		if p, ok := s.inPython(sites); ok {
			return Library{p, "the system's site-packages"}, nil
		}
	}
	for _, dir := range s.systemDirs {
		if p, ok := s.inDir(dir); ok {
			return Library{p, "the system folder " + dir}, nil
		}
	}
	return Library{}, &LibraryNotFoundError{Tried: s.tried}
}

// exeEnv is the Python environment an executable in dir was installed
// into by pip (the wheel puts fp16audit in <env>/bin), "" when dir is no
// such bin folder: the environment need not be activated.
func exeEnv(dir string) string {
	if filepath.Base(dir) != "bin" {
		return ""
	}
	env := filepath.Dir(dir)
	if matches, _ := filepath.Glob(prefixSites(env)); len(matches) == 0 {
		return ""
	}
	return env
}

// prefixSites is the pattern of the site-packages folders of the Python
// installed under prefix ("" for none).
func prefixSites(prefix string) string {
	if prefix == "" {
		return ""
	}
	return filepath.Join(prefix, "lib", "python3*", "site-packages")
}

// inPython looks for the onnxruntime package's library in the
// site-packages folders matching sites: the newest Python first, and in
// it the library file with the highest version (a wheel ships one,
// libonnxruntime.so.1.30.0; a package manager may add links).
func (s *search) inPython(sites string) (string, bool) {
	pattern := filepath.Join(sites, pythonCapi, "libonnxruntime.so*")
	if slices.Contains(s.tried, pattern) {
		return "", false
	}
	s.tried = append(s.tried, pattern)
	matches, _ := filepath.Glob(pattern)
	slices.SortFunc(matches, func(a, b string) int { return compareVersions(b, a) })
	for _, p := range matches {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, true
		}
	}
	return "", false
}

// compareVersions orders paths by the numbers in them, left to right
// (python3.9 before python3.12, .so.1.9.0 before .so.1.30.0), then as
// strings.
func compareVersions(a, b string) int {
	na, nb := numbers(a), numbers(b)
	if c := slices.Compare(na, nb); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// numbers returns the runs of digits in s as numbers.
func numbers(s string) []int {
	var out []int
	n, in := 0, false
	for _, c := range s {
		if c >= '0' && c <= '9' {
			n, in = n*10+int(c-'0'), true
			continue
		}
		if in {
			out = append(out, n)
		}
		n, in = 0, false
	}
	if in {
		out = append(out, n)
	}
	return out
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

// TooOldError is an ONNX Runtime library older than fp16audit can use.
type TooOldError = ortcapi.TooOldError

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
	if err := checkLibrary(abs); err != nil {
		return err
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

// checkLibrary loads the library at path, without creating an
// environment, and refuses one that is no ONNX Runtime library or one
// older than APIVersion, naming its version and the one needed.
func checkLibrary(path string) error {
	_, err := ortcapi.Probe(path, APIVersion)
	var old *TooOldError
	switch {
	case errors.As(err, &old):
		return fmt.Errorf("%w; upgrade it (pip install -U onnxruntime, or `make ort`, which installs 1.30.0 into .ort/), "+
			"or point --ort-lib or %s at a newer libonnxruntime.so.1", err, EnvLibrary)
	case err != nil:
		return fmt.Errorf("%v (is it an ONNX Runtime 1.x shared library for this platform?)", err)
	}
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
