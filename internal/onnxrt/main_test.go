package onnxrt

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The tests need the real library; CI installs it with `make ort`.
var (
	libPath    string
	initErr    error
	badLibErr  error // Init with a file that is no shared library
	badLibPath string
)

func TestMain(m *testing.M) {
	// ONNX Runtime allows one environment per process, so the failed load
	// must come before the real one.
	dir, err := os.MkdirTemp("", "fp16audit-runtime")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	badLibPath = filepath.Join(dir, "libonnxruntime.so.1")
	if err := os.WriteFile(badLibPath, []byte("not an ELF file"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	badLibErr = Init(badLibPath)
	libPath, initErr = FindLibrary("")
	if initErr == nil {
		initErr = Init(libPath)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireORT fails the test when the library could not be found or loaded.
func requireORT(t *testing.T) {
	t.Helper()
	if initErr != nil {
		t.Fatalf("ONNX Runtime is required for this test: %v", initErr)
	}
}
