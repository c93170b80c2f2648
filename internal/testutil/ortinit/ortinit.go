// Package ortinit loads ONNX Runtime for the tests that run models in it:
// the library ONNXRUNTIME_LIB names, or the first one onnxrt.FindLibrary
// finds. Only tests import it.
package ortinit

import (
	"testing"

	"fp16audit/internal/onnxrt"
)

// Init loads ONNX Runtime once per process, failing tb when no library is
// found or it does not load.
func Init(tb testing.TB) {
	tb.Helper()
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		tb.Fatal(err)
	}
	if err := onnxrt.Init(lib); err != nil {
		tb.Fatal(err)
	}
}
