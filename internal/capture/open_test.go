package capture_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/capture"
	"fp16audit/internal/onnx"
)

// Real captures, written by the recorder in real CPU-fp16 runs
// (fixtures/torch/runs.py): a TorchScript export with its weights inline,
// and a dynamo export whose weights are external data, in the state's
// safetensors file where the export kept a parameter's layout and in
// model.onnx.data where it transposed one.
const (
	fixture         = "../../fixtures/torch/runs/data_nan/captures/step-000030-nonfinite-loss"
	fixtureExternal = "../../fixtures/torch/runs/transformer_collapse/captures/step-000038-nonfinite-loss"
)

// copyCapture copies the fixture capture into a temporary folder.
func copyCapture(t *testing.T) string { return copyFrom(t, fixture) }

// copyFrom copies the capture fixture into a temporary folder.
func copyFrom(t *testing.T, fixture string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(fixture))
	err := filepath.WalkDir(fixture, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(fixture, p)
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// editManifest changes the manifest of the capture at dir.
func editManifest(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, capture.ManifestFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// rewrite replaces the file rel of the capture with data and, as someone
// crafting a capture would, records its new size and sha256.
func rewrite(t *testing.T, dir, rel string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(rel)), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	editManifest(t, dir, func(m map[string]any) {
		m["files"].(map[string]any)[rel] = map[string]any{"bytes": len(data), "sha256": hex.EncodeToString(sum[:])}
	})
}

func refused(t *testing.T, dir string) *capture.RefusedError {
	t.Helper()
	_, err := capture.Open(dir)
	var re *capture.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("Open: want a refusal, got %v", err)
	}
	return re
}

// wantProblem fails unless some problem is about path and says what.
func wantProblem(t *testing.T, re *capture.RefusedError, path, what string) {
	t.Helper()
	for _, p := range re.Problems {
		if strings.Contains(p.Path, path) && strings.Contains(p.What, what) {
			return
		}
	}
	t.Errorf("no problem with %q saying %q in:\n%v", path, what, re)
}

func TestOpenFixture(t *testing.T) {
	c, err := capture.Open(fixture)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Manifest
	if m.Trigger.Kind != capture.TriggerNonFiniteLoss || m.Trigger.Step != 30 || m.Precision.Policy != "autocast-fp16" {
		t.Errorf("manifest %+v", m.Trigger)
	}
	if s, ok := m.Scale(); !ok || s <= 0 {
		t.Errorf("scale %v %v", s, ok)
	}
	l, err := c.ReadLog()
	if err != nil || l == nil || len(l.Steps) == 0 || len(l.Telemetry) == 0 {
		t.Fatalf("log %+v, %v", l, err)
	}
	shapes, err := c.StateShapes()
	if err != nil || len(shapes) == 0 {
		t.Errorf("state %v, %v", shapes, err)
	}
	for name, s := range shapes {
		if len(s) == 0 && !strings.HasSuffix(name, "num_batches_tracked") {
			t.Errorf("state tensor %s without a shape", name)
		}
	}
}

// TestHostileCapture: a capture holding a pickle, an escaping path and a
// truncated tensor is refused, and the refusal names each.
func TestHostileCapture(t *testing.T) {
	dir := copyCapture(t)
	// a pickle (protocol 4), listed in the manifest with its true hash
	pickle := []byte("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93.")
	if err := os.WriteFile(filepath.Join(dir, "state", "extra.bin"), pickle, 0o644); err != nil {
		t.Fatal(err)
	}
	rewrite(t, dir, "state/extra.bin", pickle)
	// a path out of the folder
	editManifest(t, dir, func(m map[string]any) {
		m["batches"].(map[string]any)["failing"].(map[string]any)["target"] = "../../../../etc/passwd"
	})
	// a truncated tensor, its file's hash updated to match
	st := filepath.Join(dir, "state", "model.safetensors")
	data, err := os.ReadFile(st)
	if err != nil {
		t.Fatal(err)
	}
	rewrite(t, dir, "state/model.safetensors", data[:len(data)-100])
	re := refused(t, dir)
	wantProblem(t, re, "state/extra.bin", "pickle")
	wantProblem(t, re, "../../../../etc/passwd", "escapes the folder")
	wantProblem(t, re, "state/model.safetensors", "truncated")
	msg := re.Error()
	for _, s := range []string{"3 problems", "extra.bin", "etc/passwd", "model.safetensors"} {
		if !strings.Contains(msg, s) {
			t.Errorf("the message does not say %q:\n%s", s, msg)
		}
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name       string
		break_     func(t *testing.T, dir string)
		path, what string
	}{
		{"no manifest", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, capture.ManifestFile)) },
			"manifest.json", "not a capture folder, or a capture interrupted"},
		{"newer format", func(t *testing.T, dir string) { editManifest(t, dir, func(m map[string]any) { m["version"] = "2.0" }) },
			"manifest.json", "capture format 2.0 is newer than this fp16audit reads (1.x)"},
		{"another format", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m["format"] = "something" })
		},
			"manifest.json", "not an fp16audit capture"},
		{"incomplete", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { delete(m["model"].(map[string]any), "path") })
		}, "manifest.json", "model.path is missing"},
		{"missing file", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "batch.npz")) }, "batch.npz", "is missing"},
		{"changed file", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "target.npy")
			data, _ := os.ReadFile(p)
			data[len(data)-1] ^= 1
			os.WriteFile(p, data, 0o644)
		}, "target.npy", "sha256"},
		{"truncated file", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.onnx.data")
			data, _ := os.ReadFile(p)
			os.WriteFile(p, data[:len(data)/2], 0o644)
		}, "model.onnx.data", "truncated"},
		{"absolute path", func(t *testing.T, dir string) {
			editManifest(t, dir, func(m map[string]any) { m["log"] = "/etc/passwd" })
		}, "/etc/passwd", "is absolute"},
		{"symlink", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "target.npy"))
			os.Symlink("/etc/passwd", filepath.Join(dir, "target.npy"))
		}, "target.npy", "symlink"},
		{"object array", func(t *testing.T, dir string) {
			var b bytes.Buffer
			zw := zip.NewWriter(&b)
			w, _ := zw.Create("input.npy")
			hdr := "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
			hdr += strings.Repeat(" ", 118-len(hdr)) + "\n"
			w.Write(append([]byte("\x93NUMPY\x01\x00\x76\x00"+hdr), pickleObj()...))
			zw.Close()
			rewrite(t, dir, "batch.npz", b.Bytes())
		}, "batch.npz", "pickle"},
		{"torch.save file", func(t *testing.T, dir string) {
			var b bytes.Buffer
			zw := zip.NewWriter(&b)
			w, _ := zw.Create("archive/data.pkl")
			w.Write(pickleObj())
			zw.Close()
			os.WriteFile(filepath.Join(dir, "weights.bin"), b.Bytes(), 0o644)
		}, "weights.bin", "pickle"},
		{"changed weights in the state", func(t *testing.T, dir string) {
			// the model's weights lie in the state's safetensors file: the
			// replay reads them, so their sha256 is checked too
			p := filepath.Join(dir, "state", "model.safetensors")
			data, _ := os.ReadFile(p)
			data[len(data)-1] ^= 1
			os.WriteFile(p, data, 0o644)
		}, "state/model.safetensors", "sha256"},
		{"model does not load", func(t *testing.T, dir string) { rewrite(t, dir, "model.onnx", []byte("not a model at all")) },
			"model.onnx", "does not decode as an ONNX model"},
		{"external data escapes", func(t *testing.T, dir string) {
			data, _ := os.ReadFile(filepath.Join(dir, "model.onnx"))
			var mp onnx.ModelProto
			if err := proto.Unmarshal(data, &mp); err != nil {
				t.Fatal(err)
			}
			for _, init := range mp.Graph.Initializer {
				for _, kv := range init.ExternalData {
					if kv.GetKey() == "location" {
						kv.Value = "../../outside.data"
					}
				}
			}
			out, err := onnx.Marshal(&mp)
			if err != nil {
				t.Fatal(err)
			}
			rewrite(t, dir, "model.onnx", out)
		}, "../../outside.data", "escapes the folder"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyCapture(t)
			if strings.Contains(c.path, ".data") || strings.Contains(c.name, "weights") {
				// the cases about external data take the dynamo export
				dir = copyFrom(t, fixtureExternal)
			}
			c.break_(t, dir)
			wantProblem(t, refused(t, dir), c.path, c.what)
		})
	}
}

func pickleObj() []byte { return []byte("\x80\x02cos\nsystem\nq\x00.") }

// TestVerifyLater: Start hashes a large file beside its caller and Verify
// refuses it when it changed; a truncated one Start refuses at once, by
// its size, before anything reads it.
func TestVerifyLater(t *testing.T) {
	defer capture.SetHashInline(1)()
	dir := copyFrom(t, fixtureExternal)
	c, err := capture.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(); err != nil {
		t.Fatalf("the unchanged capture: %v", err)
	}
	p := filepath.Join(dir, "model.onnx.data")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err = capture.Start(dir); err != nil {
		t.Fatalf("Start checks sizes and headers, and hashes the large files later: %v", err)
	}
	var re *capture.RefusedError
	if err := c.Verify(); !errors.As(err, &re) {
		t.Fatalf("Verify: want a refusal, got %v", err)
	}
	wantProblem(t, re, "model.onnx.data", "sha256")
	if err := os.WriteFile(p, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := capture.Start(dir); !errors.As(err, &re) {
		t.Fatalf("Start: want the truncated file refused, got %v", err)
	}
	wantProblem(t, re, "model.onnx.data", "truncated")
}
