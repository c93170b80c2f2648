package ortcapi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"fp16audit/internal/onnx"
)

// runtimeForTest opens the library `make ort` installs (or the one
// ONNXRUNTIME_LIB names); the tests need it.
func runtimeForTest(t testing.TB) *Runtime {
	t.Helper()
	// onnxrt.FindLibrary would search further, but onnxrt imports this
	// package.
	lib := os.Getenv("ONNXRUNTIME_LIB")
	if lib == "" {
		lib = filepath.Join("..", "..", ".ort", "libonnxruntime.so.1")
	}
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("ONNX Runtime is required for this test (make ort): %v", err)
	}
	rt, err := Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// affineModel computes y = x·W + b for x of shape [n, 2], with W and b
// initializers.
func affineModel(t testing.TB, w, b []float32) []byte {
	t.Helper()
	g := &onnx.GraphProto{
		Name: "affine",
		Node: []*onnx.NodeProto{
			onnx.Node("MatMul", "mm", []string{"x", "W"}, []string{"xw"}),
			onnx.Node("Add", "add", []string{"xw", "b"}, []string{"y"}),
		},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("W", []int64{2, 3}, w), onnx.FloatTensor("b", []int64{3}, b)},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, "n", 2)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, "n", 3)},
	}
	data, err := onnx.Marshal(onnx.NewModel(g, 17))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func affine(x, w, b []float32) []float32 {
	var y []float32
	for r := 0; r < len(x)/2; r++ {
		for c := range 3 {
			y = append(y, x[2*r]*w[c]+x[2*r+1]*w[3+c]+b[c])
		}
	}
	return y
}

func TestOpenTwice(t *testing.T) {
	rt := runtimeForTest(t)
	if rt.Version() == "" {
		t.Error("empty version string")
	}
	again, err := Open(rt.path)
	if err != nil || again != rt {
		t.Errorf("second Open of the same library: %v, %p != %p", err, again, rt)
	}
	other := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	if err := os.WriteFile(other, []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(other); err == nil || !strings.Contains(err.Error(), "already loaded") {
		t.Errorf("Open of a second library: got %v, want an already-loaded error", err)
	}
}

func TestRunPreallocatedAndAllocated(t *testing.T) {
	rt := runtimeForTest(t)
	w, b := []float32{1, 2, 3, 4, 5, 6}, []float32{0.5, -1, 2}
	for _, o := range []Options{{Level: LevelNone}, {Level: LevelAll}, {Level: LevelAll, NoMemPattern: true}} {
		level := o.Level
		s, err := rt.NewSession(affineModel(t, w, b), []string{"x"}, []string{"y"}, o)
		if err != nil {
			t.Fatal(err)
		}
		if in, out := s.Inputs(), s.Outputs(); len(in) != 1 || in[0] != "x" || len(out) != 1 || out[0] != "y" {
			t.Errorf("names %v -> %v, want [x] -> [y]", in, out)
		}
		x := []float32{1, -1, 0.25, 8}
		in, err := NewTensorOf(rt, []int64{2, 2}, x)
		if err != nil {
			t.Fatal(err)
		}
		want := affine(x, w, b)

		buf := make([]float32, 6)
		pre, err := NewTensorOf(rt, []int64{2, 3}, buf)
		if err != nil {
			t.Fatal(err)
		}
		outs := []*Value{pre}
		if err := s.Run([]*Value{in}, outs); err != nil {
			t.Fatal(err)
		}
		if outs[0] != pre {
			t.Error("a preallocated output was replaced")
		}
		for i := range want {
			if buf[i] != want[i] {
				t.Fatalf("level %d, preallocated: y = %v, want %v", level, buf, want)
			}
		}

		outs = []*Value{nil}
		if err := s.Run([]*Value{in}, outs); err != nil {
			t.Fatal(err)
		}
		got, err := Elements[float32](outs[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, shape, _ := outs[0].Info(); len(shape) != 2 || shape[0] != 2 || shape[1] != 3 {
			t.Errorf("allocated output shape %v, want [2 3]", shape)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("level %d, allocated: y = %v, want %v", level, got, want)
			}
		}
		outs[0].Release()
		pre.Release()
		in.Release()
		s.Close()
	}
}

// TestSharedInitializer: sessions given the same caller-owned initializer
// use it instead of the model's own, without copying it.
func TestSharedInitializer(t *testing.T) {
	rt := runtimeForTest(t)
	model := affineModel(t, []float32{0, 0, 0, 0, 0, 0}, []float32{0, 0, 0})
	w := []float32{1, 0, -1, 2, 3, 0.5}
	wv, err := NewTensorOf(rt, []int64{2, 3}, w)
	if err != nil {
		t.Fatal(err)
	}
	defer wv.Release()
	pack, err := rt.NewPrepackedWeights()
	if err != nil {
		t.Fatal(err)
	}
	defer pack.Release()
	var sessions []*Session
	for range 2 {
		s, err := rt.NewSession(model, []string{"x"}, []string{"y"}, Options{Initializers: map[string]*Value{"W": wv}, Prepacked: pack})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sessions = append(sessions, s)
	}
	x := []float32{2, 1}
	in, err := NewTensorOf(rt, []int64{1, 2}, x)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Release()
	want := affine(x, w, []float32{0, 0, 0})
	for i, s := range sessions {
		outs := []*Value{nil}
		if err := s.Run([]*Value{in}, outs); err != nil {
			t.Fatal(err)
		}
		got, _ := Elements[float32](outs[0])
		for k := range want {
			if got[k] != want[k] {
				t.Errorf("session %d: y = %v, want %v (the shared W)", i, got, want)
				break
			}
		}
		outs[0].Release()
	}
}

func TestErrors(t *testing.T) {
	rt := runtimeForTest(t)
	_, err := rt.NewSession([]byte("not a model"), []string{"x"}, []string{"y"}, Options{})
	var oe *Error
	if !errors.As(err, &oe) || oe.Code == 0 || oe.Msg == "" {
		t.Errorf("bad model bytes: got %v, want an *Error with a code", err)
	}
	s, err := rt.NewSession(affineModel(t, make([]float32, 6), make([]float32, 3)), []string{"x"}, []string{"y"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in, err := NewTensorOf(rt, []int64{3}, []float32{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Release()
	if err := s.Run([]*Value{in}, []*Value{nil}); !errors.As(err, &oe) {
		t.Errorf("input of the wrong rank: got %v, want an *Error", err)
	}
	if err := s.Run(nil, []*Value{nil}); err == nil {
		t.Error("no inputs: want an error")
	}
	if _, err := Elements[int64](in); err == nil {
		t.Error("Elements[int64] of a float tensor: want an error")
	}
}

func TestConcurrentRuns(t *testing.T) {
	rt := runtimeForTest(t)
	w, b := []float32{1, 2, 3, 4, 5, 6}, []float32{1, 1, 1}
	s, err := rt.NewSession(affineModel(t, w, b), []string{"x"}, []string{"y"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range errs {
		wg.Go(func() {
			x := []float32{float32(g), 1}
			in, err := NewTensorOf(rt, []int64{1, 2}, x)
			if err != nil {
				errs[g] = err
				return
			}
			defer in.Release()
			for range 50 {
				out := make([]float32, 3)
				ov, err := NewTensorOf(rt, []int64{1, 3}, out)
				if err != nil {
					errs[g] = err
					return
				}
				err = s.Run([]*Value{in}, []*Value{ov})
				ov.Release()
				if err != nil {
					errs[g] = err
					return
				}
				want := affine(x, w, b)
				for k := range want {
					if out[k] != want[k] {
						errs[g] = errors.New("wrong result under concurrency")
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestParseLevel(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Level
		ok   bool
	}{{"", LevelAll, true}, {"all", LevelAll, true}, {"extended", LevelExtended, true}, {"basic", LevelBasic, true},
		{"none", LevelNone, true}, {"fast", 0, false}} {
		got, err := ParseLevel(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseLevel(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

// TestHugePages runs models whose values are hundreds of kilobytes (slab
// blocks) and megabytes (mappings of their own) on the huge-page
// allocator: the results are exact, the blocks freed in a run serve the
// next one instead of new memory, and nothing stays mapped once the
// session and its outputs are gone.
func TestHugePages(t *testing.T) {
	rt := runtimeForTest(t)
	w, b := []float32{1, 2, 3, 4, 5, 6}, []float32{0.5, -1, 2}
	// y and the product before the Add: 240 kB, 996 kB (above the largest
	// slab class, 960 KiB, below 1 MiB) or 2.4 MB each
	for _, n := range []int{20_000, 83_000, 200_000} {
		x := make([]float32, 2*n)
		for i := range x {
			x[i] = float32(i%97) - 48
		}
		want := affine(x, w, b)
		in, err := NewTensorOf(rt, []int64{int64(n), 2}, x)
		if err != nil {
			t.Fatal(err)
		}
		s, err := rt.NewSession(affineModel(t, w, b), []string{"x"}, []string{"y"}, Options{Level: LevelNone, NoMemPattern: true, HugePages: true})
		if err != nil {
			t.Fatal(err)
		}
		run := func() (*Value, hugeState) {
			outs := []*Value{nil}
			if err := s.Run([]*Value{in}, outs); err != nil {
				t.Fatal(err)
			}
			y, err := Elements[float32](outs[0])
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if y[i] != want[i] {
					t.Fatalf("n=%d: y[%d] = %g, want %g", n, i, y[i], want[i])
				}
			}
			return outs[0], hugeStats()
		}
		y1, st := run()
		big := n*12+64 > 15*64<<10 // the block and its header
		switch {
		case big && st.inUse < int64(12*n):
			t.Errorf("n=%d: with the output held, %d bytes in use; want at least the output's %d", n, st.inUse, 12*n)
		case big && st.kept == 0:
			t.Errorf("n=%d: the product freed in the run was not kept", n)
		case !big && (st.slabs == 0 || st.slabFree == 0):
			t.Errorf("n=%d: %d slabs, %d free blocks; want the output in a slab and the product's block free", n, st.slabs, st.slabFree)
		}
		y1.Release()
		y2, st2 := run()
		if st2.inUse+st2.kept != st.inUse+st.kept || st2.slabs != st.slabs {
			t.Errorf("n=%d: second run: %d bytes mapped and %d slabs, the first %d and %d; want the first run's blocks reused",
				n, st2.inUse+st2.kept, st2.slabs, st.inUse+st.kept, st.slabs)
		}
		s.Close()
		if st := hugeStats(); big && st.inUse == 0 || !big && st.slabs == 0 {
			t.Errorf("n=%d: the output held after the session closed lost its memory: %+v", n, st)
		}
		y2.Release()
		in.Release()
		if st := hugeStats(); st != (hugeState{}) {
			t.Errorf("n=%d: after the session and its outputs: %+v; want nothing mapped", n, st)
		}
	}
}
