package diagnose

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoRuntime: the diagnosis, its verdict tree and their tests need
// neither cgo nor ONNX Runtime: no package they import (tests included)
// has cgo files or binds the runtime.
func TestNoRuntime(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-test", "-f", "{{.ImportPath}} {{.Standard}} {{len .CgoFiles}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[1] == "true" {
			continue
		}
		if f[2] != "0" || strings.Contains(f[0], "onnxruntime") || strings.HasSuffix(f[0], "/ortcapi") ||
			strings.HasSuffix(f[0], "/onnxrt") || strings.HasSuffix(f[0], "/statsop") || strings.Contains(f[0], "/execute") {
			t.Errorf("%s (%s cgo files) is a dependency of the diagnosis or its tests", f[0], f[2])
		}
	}
}
