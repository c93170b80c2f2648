package ortcapi

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"fp16audit/internal/onnx"
)

// chainModel is n MatMuls of x [size, size] with one weight after the
// other: a run long enough (seconds) to stop in the middle, since ONNX
// Runtime checks its terminate flag between nodes.
func chainModel(t testing.TB, n, size int) []byte {
	t.Helper()
	w := make([]float32, size*size)
	for i := range w {
		w[i] = float32(i%7-3) / float32(size)
	}
	g := &onnx.GraphProto{Name: "chain",
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("W", []int64{int64(size), int64(size)}, w)},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, size, size)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, size, size)},
	}
	prev := "x"
	for i := range n {
		out := "h" + string(rune('a'+i%26)) + strings.Repeat("_", i/26)
		if i == n-1 {
			out = "y"
		}
		g.Node = append(g.Node, onnx.Node("MatMul", out+"_mm", []string{prev, "W"}, []string{out}))
		prev = out
	}
	data, err := onnx.Marshal(onnx.NewModel(g, 17))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// smallSession is a session of a zero affine model, x [1, 2] → y [1, 3],
// on one thread, closed when the test ends.
func smallSession(t *testing.T, rt *Runtime) *Session {
	t.Helper()
	s, err := rt.NewSession(affineModel(t, make([]float32, 6), make([]float32, 3)), []string{"x"}, []string{"y"}, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// smallInput is smallSession's x, [[1, 2]], released when the test ends.
func smallInput(t *testing.T, rt *Runtime) *Value {
	t.Helper()
	in, err := NewTensorOf(rt, []int64{1, 2}, []float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Release)
	return in
}

// TestTerminateFlagStopsRuns: with the run options' terminate flag set,
// ONNX Runtime itself refuses to run (the flag reaches the library).
func TestTerminateFlagStopsRuns(t *testing.T) {
	rt := runtimeForTest(t)
	s := smallSession(t, rt)
	in := smallInput(t, rt)
	s.terminate()
	err := s.Run([]*Value{in}, []*Value{nil})
	var oe *Error
	if !errors.As(err, &oe) || !strings.Contains(oe.Msg, "terminate") {
		t.Fatalf("run with the terminate flag set: %v, want ONNX Runtime's terminate error", err)
	}
}

// TestStopOnEndsRunInFlight: a run far longer than the test is stopped
// when its context is cancelled, with the context's error; later runs of
// the session fail at once, another session runs on.
func TestStopOnEndsRunInFlight(t *testing.T) {
	rt := runtimeForTest(t)
	const size = 512
	s, err := rt.NewSession(chainModel(t, 1000, size), []string{"x"}, []string{"y"}, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	x := make([]float32, size*size)
	in, err := NewTensorOf(rt, []int64{size, size}, x)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer s.StopOn(ctx)()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Run([]*Value{in}, []*Value{nil}) }()
	// Let the run get going: the cancellation must reach a run in flight.
	time.Sleep(200 * time.Millisecond)
	cancel()
	err = <-done
	t.Logf("stopped after %v: %v", time.Since(start), err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run after cancel: %v, want an error wrapping context.Canceled", err)
	}
	if err := s.Run([]*Value{in}, []*Value{nil}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a later run of the stopped session: %v, want context.Canceled", err)
	}
	other := smallSession(t, rt)
	outs := []*Value{nil}
	if err := other.Run([]*Value{smallInput(t, rt)}, outs); err != nil {
		t.Fatalf("another session after the stop: %v", err)
	}
	outs[0].Release()
}

// TestStopOnDetached: a context that ends after StopOn's detach stops
// nothing.
func TestStopOnDetached(t *testing.T) {
	rt := runtimeForTest(t)
	s := smallSession(t, rt)
	ctx, cancel := context.WithCancel(context.Background())
	s.StopOn(ctx)()
	cancel()
	in := smallInput(t, rt)
	outs := []*Value{nil}
	if err := s.Run([]*Value{in}, outs); err != nil {
		t.Fatalf("run after a detached context ended: %v", err)
	}
	outs[0].Release()
}

// TestStopOnEnded: a context that has already ended stops the very next
// run, every time (no race with a goroutine setting the flag).
func TestStopOnEnded(t *testing.T) {
	rt := runtimeForTest(t)
	in := smallInput(t, rt)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 50 {
		s := smallSession(t, rt)
		s.StopOn(ctx)
		if err := s.Run([]*Value{in}, []*Value{nil}); !errors.Is(err, context.Canceled) {
			t.Fatalf("session %d: run after StopOn of an ended context: %v, want context.Canceled", i, err)
		}
	}
}

// TestRunOutOfMemory: a failed allocation in Run is an error, not a crash,
// and the next run works.
func TestRunOutOfMemory(t *testing.T) {
	rt := runtimeForTest(t)
	s := smallSession(t, rt)
	in := smallInput(t, rt)
	failAllocs(1)
	defer failAllocs(0)
	if err := s.Run([]*Value{in}, []*Value{nil}); err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("run with its allocation failing: %v, want an out-of-memory error", err)
	}
	outs := []*Value{nil}
	if err := s.Run([]*Value{in}, outs); err != nil {
		t.Fatalf("the run after: %v", err)
	}
	outs[0].Release()
}

// TestDroppedValueIsCollected: values dropped without Release — over
// pinned Go memory and allocated by ONNX Runtime — are freed by the
// garbage collector; an unreleased pin would abort the process instead.
func TestDroppedValueIsCollected(t *testing.T) {
	rt := runtimeForTest(t)
	s := smallSession(t, rt)
	before := collected.Load()
	func() {
		for range 4 {
			in, err := NewTensorOf(rt, []int64{1, 2}, []float32{1, 2})
			if err != nil {
				t.Fatal(err)
			}
			outs := []*Value{nil}
			if err := s.Run([]*Value{in}, outs); err != nil {
				t.Fatal(err)
			}
		}
	}()
	for range 100 {
		runtime.GC()
		if collected.Load()-before >= 8 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := collected.Load() - before; got < 8 {
		t.Fatalf("%d of the 8 dropped values were collected", got)
	}
	kept, err := NewTensorOf(rt, []int64{1}, []float32{1})
	if err != nil {
		t.Fatal(err)
	}
	kept.Release()
	kept.Release() // a second Release does nothing
}

// childEnv, when set, makes TestNoTempFilesLeft's child process open the
// library; the parent checks what it left.
const childEnv = "FP16AUDIT_ORTCAPI_CHILD"

// TestNoTempFilesLeft: creating the environment leaves nothing in the
// temporary folder and changes no environment variable. It runs in a
// fresh process, since the environment exists once per process.
func TestNoTempFilesLeft(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		before := os.Environ()
		runtimeForTest(t)
		if after := os.Environ(); !slices.Equal(before, after) {
			t.Fatalf("the environment changed:\nbefore %v\nafter  %v", before, after)
		}
		return
	}
	lib, err := filepath.Abs(filepath.Join("..", "..", ".ort", "libonnxruntime.so.1"))
	if env := os.Getenv("ONNXRUNTIME_LIB"); env != "" {
		lib, err = filepath.Abs(env)
	}
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoTempFilesLeft$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1", "TMPDIR="+tmp, "ONNXRUNTIME_LIB="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("the temporary folder holds %s after the environment was created", e.Name())
	}
}
