package onnxrt

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func touch(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFindLibraryOrder(t *testing.T) {
	root := t.TempDir()
	explicit := touch(t, filepath.Join(root, "flag", "custom.so"))
	envLib := touch(t, filepath.Join(root, "env", "libonnxruntime.so.1"))
	// The executable sits in repo/bin, so its .ort is one folder up.
	exeLib := touch(t, filepath.Join(root, "exe", ".ort", "libonnxruntime.so.1"))
	exeDir := filepath.Join(root, "exe", "bin")
	// The working directory is two folders below the repository root.
	wdLib := touch(t, filepath.Join(root, "wd", ".ort", "libonnxruntime.so.1"))
	workDir := filepath.Join(root, "wd", "cmd", "fp16audit")
	sys1 := filepath.Join(root, "sys1")
	sys2Lib := touch(t, filepath.Join(root, "sys2", "libonnxruntime.so"))
	for _, d := range []string{exeDir, workDir, sys1} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := search{env: envLib, exeDir: exeDir, workDir: workDir, systemDirs: []string{sys1, filepath.Dir(sys2Lib)}}
	tests := []struct {
		name     string
		explicit string
		edit     func(s *search)
		want     string
	}{
		{"explicit first", explicit, nil, explicit},
		{"explicit folder", filepath.Dir(envLib), nil, envLib},
		{"env second", "", nil, envLib},
		{"env naming a missing file is skipped", "", func(s *search) { s.env = filepath.Join(root, "nope.so") }, exeLib},
		{".ort above the executable", "", func(s *search) { s.env = "" }, exeLib},
		{".ort above the working directory", "", func(s *search) { s.env, s.exeDir = "", "" }, wdLib},
		{"system folders last", "", func(s *search) { s.env, s.exeDir, s.workDir = "", "", "" }, sys2Lib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			s.tried = nil
			if tt.edit != nil {
				tt.edit(&s)
			}
			got, err := s.find(tt.explicit)
			if err != nil {
				t.Fatal(err)
			}
			if got.Path != tt.want {
				t.Errorf("found %s, want %s", got.Path, tt.want)
			}
		})
	}
}

func TestFindLibraryNameOrder(t *testing.T) {
	dir := t.TempDir()
	touch(t, filepath.Join(dir, "libonnxruntime.so"))
	want := touch(t, filepath.Join(dir, "libonnxruntime.so.1"))
	s := search{systemDirs: []string{dir}}
	if got, err := s.find(""); err != nil || got.Path != want {
		t.Errorf("find = %q, %v; want %s", got.Path, err, want)
	}
}

func TestFindLibraryExplicitMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	s := search{env: touch(t, filepath.Join(t.TempDir(), "libonnxruntime.so.1"))}
	_, err := s.find(missing)
	if err == nil {
		t.Fatal("a missing --ort-lib was accepted")
	}
	var nf *LibraryNotFoundError
	if errors.As(err, &nf) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("want a not-exist error of its own, got %T: %v", err, err)
	}
	t.Log(err)
	for _, want := range []string{missing, "--ort-lib", "make ort"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q:\n%v", want, err)
		}
	}
}

func TestLibraryNotFound(t *testing.T) {
	root := t.TempDir()
	s := search{
		env:        filepath.Join(root, "env", "libonnxruntime.so.1"),
		exeDir:     filepath.Join(root, "bin"),
		workDir:    filepath.Join(root, "work"),
		systemDirs: []string{filepath.Join(root, "usr", "lib")},
	}
	_, err := s.find("")
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("want *LibraryNotFoundError, got %T: %v", err, err)
	}
	wantTried := []string{
		s.env,
		filepath.Join(root, "bin", ".ort", "libonnxruntime.so.1"),
		filepath.Join(root, ".ort", "libonnxruntime.so"),
		"/.ort/libonnxruntime.so.1",
		filepath.Join(root, "work", ".ort", "libonnxruntime.so.1"),
		filepath.Join(root, "usr", "lib", "libonnxruntime.so.1"),
		filepath.Join(root, "usr", "lib", "libonnxruntime.so"),
	}
	msg := err.Error()
	t.Log(msg)
	seen := map[string]bool{}
	for _, p := range nf.Tried {
		if seen[p] {
			t.Errorf("%s tried twice", p)
		}
		seen[p] = true
	}
	for _, p := range wantTried {
		if !slices.Contains(nf.Tried, p) {
			t.Errorf("Tried lacks %s", p)
		}
		if !strings.Contains(msg, "  "+p+"\n") {
			t.Errorf("message lacks tried path %s", p)
		}
	}
	for _, want := range []string{"make ort", "onnxruntime-node@1.30.0", "npm", EnvLibrary, "--ort-lib"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
}

func TestFindLibraryFromWorkingDirectory(t *testing.T) {
	root := t.TempDir()
	want := touch(t, filepath.Join(root, ".ort", "libonnxruntime.so.1"))
	sub := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvLibrary, "")
	t.Chdir(sub)
	got, err := FindLibrary("")
	if err != nil {
		t.Fatal(err)
	}
	// A .ort above the test binary would come first.
	if exe, err := os.Executable(); err == nil {
		s := search{exeDir: filepath.Dir(exe)}
		if p, err := s.find(""); err == nil {
			want = p.Path
		}
	}
	if got != want {
		t.Errorf("found %s, want %s", got, want)
	}
}

func TestInit(t *testing.T) {
	requireORT(t)
	if badLibErr == nil || !strings.Contains(badLibErr.Error(), badLibPath) {
		t.Errorf("loading a non-library: want an error naming %s, got %v", badLibPath, badLibErr)
	}
	if err := Init(libPath); err != nil {
		t.Errorf("second Init with the same library: %v", err)
	}
	other := touch(t, filepath.Join(t.TempDir(), "libonnxruntime.so.1"))
	if err := Init(other); err == nil || !strings.Contains(err.Error(), "already loaded") {
		t.Errorf("Init with another library: want an already-loaded error, got %v", err)
	}
	if v := Version(); !strings.HasPrefix(v, "1.") {
		t.Errorf("Version() = %q, want 1.x", v)
	}
	t.Logf("ONNX Runtime %s from %s", Version(), libPath)
}
