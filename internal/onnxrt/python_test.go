package onnxrt

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sitePackages returns prefix's site-packages folder of python3.minor.
func sitePackages(prefix string, minor int) string {
	return filepath.Join(prefix, "lib", "python3."+strconv.Itoa(minor), "site-packages")
}

// TestFindLibraryInPython: the onnxruntime package of a virtualenv, a
// conda environment, the user's and the system's site-packages is found,
// in that order, after .ort/; the newest Python's and the highest library
// version win, and the Library says where it came from.
func TestFindLibraryInPython(t *testing.T) {
	root := t.TempDir()
	venv, conda, user := filepath.Join(root, "venv"), filepath.Join(root, "conda"), filepath.Join(root, "home", ".local")
	venvLib := touch(t, filepath.Join(sitePackages(venv, 12), "onnxruntime", "capi", "libonnxruntime.so.1.30.0"))
	// An older Python of the same virtualenv, an older library beside.
	touch(t, filepath.Join(sitePackages(venv, 9), "onnxruntime", "capi", "libonnxruntime.so.1.31.0"))
	touch(t, filepath.Join(sitePackages(venv, 12), "onnxruntime", "capi", "libonnxruntime.so.1.9.0"))
	touch(t, filepath.Join(sitePackages(venv, 12), "onnxruntime", "capi", "libonnxruntime_providers_shared.so"))
	condaLib := touch(t, filepath.Join(sitePackages(conda, 11), "onnxruntime", "capi", "libonnxruntime.so.1.25.1"))
	userLib := touch(t, filepath.Join(sitePackages(user, 10), "onnxruntime", "capi", "libonnxruntime.so.1.24.0"))
	system := filepath.Join(root, "usr", "lib", "python3", "dist-packages")
	systemLib := touch(t, filepath.Join(system, "onnxruntime", "capi", "libonnxruntime.so.1.28.0"))
	dotOrt := touch(t, filepath.Join(root, "repo", ".ort", "libonnxruntime.so.1"))
	base := search{virtualEnv: venv, condaPrefix: conda, userBase: user, systemSites: []string{system}}
	tests := []struct {
		name       string
		edit       func(*search)
		want, from string
	}{
		{".ort before Python", func(s *search) { s.workDir = filepath.Dir(dotOrt) }, dotOrt, ".ort/"},
		{"the virtualenv", nil, venvLib, "the virtualenv " + venv},
		{"the conda environment", func(s *search) { s.virtualEnv = "" }, condaLib, "the conda environment " + conda},
		{"the user's site-packages", func(s *search) { s.virtualEnv, s.condaPrefix = "", "" }, userLib, "the user's site-packages"},
		{"the system's site-packages", func(s *search) { s.virtualEnv, s.condaPrefix, s.userBase = "", "", "" }, systemLib, "the system's site-packages"},
		{"a virtualenv without onnxruntime", func(s *search) { s.virtualEnv = filepath.Join(root, "empty") }, condaLib, "conda"},
		// the wheel's binary in <venv>/bin, the virtualenv not activated
		{"the executable's environment", func(s *search) { s.virtualEnv, s.exeDir = "", filepath.Join(venv, "bin") }, venvLib, "the Python environment " + venv + " the executable"},
		{"an executable in no environment", func(s *search) { s.virtualEnv, s.exeDir = "", filepath.Join(root, "usr", "bin") }, condaLib, "conda"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			if tt.edit != nil {
				tt.edit(&s)
			}
			got, err := s.find("")
			if err != nil {
				t.Fatal(err)
			}
			if got.Path != tt.want || !strings.Contains(got.From, tt.from) {
				t.Errorf("found %s (from %s), want %s (from %s)", got.Path, got.From, tt.want, tt.from)
			}
		})
	}
	s := search{virtualEnv: filepath.Join(root, "empty")}
	_, err := s.find("")
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) || !strings.Contains(err.Error(), filepath.Join(root, "empty", "lib", "python3*", "site-packages", "onnxruntime", "capi", "libonnxruntime.so*")) ||
		!strings.Contains(err.Error(), "pip install onnxruntime") {
		t.Errorf("nothing found: %v, want the virtualenv's pattern among the tried paths and the pip hint", err)
	}
}

// TestInitFromVirtualenv: the real library inside a virtualenv's
// onnxruntime package (linked, as pip's wheel names it) is found, and it
// is the library this process runs.
func TestInitFromVirtualenv(t *testing.T) {
	requireORT(t)
	venv := t.TempDir()
	capi := filepath.Join(sitePackages(venv, 11), "onnxruntime", "capi")
	if err := os.MkdirAll(capi, 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(capi, "libonnxruntime.so.1.30.0")
	real, err := filepath.Abs(libPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, lib); err != nil {
		t.Fatal(err)
	}
	s := search{virtualEnv: venv}
	got, err := s.find("")
	if err != nil || got.Path != lib {
		t.Fatalf("find = %v, %v; want %s", got, err, lib)
	}
	if err := Init(got.Path); err != nil {
		t.Fatalf("Init of the library in the virtualenv: %v", err)
	}
	if v := Version(); !strings.HasPrefix(v, "1.") {
		t.Errorf("Version() = %q", v)
	}
}

// fakeLibrary compiles testdata/oldort.c into a library that reports
// version and provides OrtApi versions up to maxAPI.
func fakeLibrary(t *testing.T, version string, maxAPI int) string {
	t.Helper()
	cc := "cc"
	if out, err := exec.Command("go", "env", "CC").Output(); err == nil && strings.TrimSpace(string(out)) != "" {
		cc = strings.TrimSpace(string(out))
	}
	lib := filepath.Join(t.TempDir(), "libonnxruntime.so."+version)
	cmd := exec.Command(cc, "-shared", "-fPIC", "-o", lib, `-DVERSION="`+version+`"`, "-DMAXAPI="+strconv.Itoa(maxAPI), filepath.Join("testdata", "oldort.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	return lib
}

// TestOldLibraryRefused: a library older than the C API version fp16audit
// needs is refused before anything runs, naming its version and the one
// needed; a library that claims a new enough version but lacks the API
// is refused as well.
func TestOldLibraryRefused(t *testing.T) {
	for _, c := range []struct {
		version string
		maxAPI  int
	}{
		{"1.16.3", 16},
		{"1.99.0", APIVersion - 1},
	} {
		lib := fakeLibrary(t, c.version, c.maxAPI)
		err := checkLibrary(lib)
		var old *TooOldError
		if !errors.As(err, &old) || old.Version != c.version || old.API != APIVersion {
			t.Fatalf("%s: %v, want a *TooOldError", c.version, err)
		}
		msg := err.Error()
		for _, want := range []string{c.version, lib, "1." + strconv.Itoa(APIVersion) + " or newer", "pip install -U onnxruntime", "--ort-lib"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message lacks %q: %s", c.version, want, msg)
			}
		}
	}
	if err := checkLibrary(fakeLibrary(t, "1."+strconv.Itoa(APIVersion)+".0", APIVersion)); err != nil {
		t.Errorf("a library of the needed version: %v", err)
	}
}

// TestAPIVersionOfTheBinding: APIVersion is the OrtApi version the
// onnxruntime_go header in the module cache asks for.
func TestAPIVersionOfTheBinding(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/yalue/onnxruntime_go").Output()
	if err != nil {
		t.Fatalf("cannot find onnxruntime_go in the module cache: %v", err)
	}
	h, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "onnxruntime_c_api.h"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define ORT_API_VERSION (\d+)`).FindSubmatch(h)
	if m == nil {
		t.Fatal("no ORT_API_VERSION in onnxruntime_go's header")
	}
	if got, _ := strconv.Atoi(string(m[1])); got != APIVersion {
		t.Errorf("onnxruntime_go asks for OrtApi version %d, APIVersion is %d", got, APIVersion)
	}
}
