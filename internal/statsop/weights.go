package statsop

import (
	"fmt"
	"math"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/tensor"
)

// Weights holds the weights of one audit as ONNX Runtime tensors, made
// once and handed to every session the audit opens: the combined forward
// session, each block of one, every what-if pass and fix rerun, and the
// backward's. A session then costs its graph, never a load of the
// weights: ONNX Runtime takes a tensor given to the session
// (AddInitializer) in place of the initializer of that name and neither
// reads nor copies the model's own bytes for it.
//
//   - Weights in an external data file are mapped once (read-only for the
//     file: a private mapping, so that nothing can write to it) and each
//     tensor lies over its range of the mapping; the pages a pass touches
//     stay mapped for the next pass instead of being mapped and faulted in
//     again by every session (Drop gives them back, for a run out of core).
//   - Weights stored inline (HandsOver) lie over the loaded model's memory,
//     as a single session's always did.
//   - A FLOAT view of 16-bit weights in an external file (onnx.FloatView:
//     the upcast of a model stored in fp16 or bf16) is converted from the
//     file's mapping into memory of its own when a session first needs
//     it, and Drop frees that memory (the next session that needs it
//     converts it again), so a run out of core holds one block's fp32
//     weights at a time.
//
// Only the tensors of the graphs given to NewWeights are held: a tensor a
// rewrite makes for one pass (a clamped constant) is that pass's session's
// own. Weights is safe for use by several goroutines.
type Weights struct {
	rt       *ortcapi.Runtime
	dir      string
	declared string
	mu       sync.Mutex
	known    map[*onnx.TensorProto]bool
	vals     map[*onnx.TensorProto]*ortcapi.Value
	maps     map[string][]byte
	// ranges are the bytes of each mapped tensor, for Drop; dropped
	// those given back since they were last handed over.
	ranges  map[*onnx.TensorProto][]byte
	dropped map[*onnx.TensorProto]bool
	// unmappable lists files that could not be mapped: ONNX Runtime
	// loads their tensors itself, as before.
	unmappable map[string]bool
	// converted holds the fp32 memory of the FLOAT views handed over.
	converted map[*onnx.TensorProto][]byte
}

// NewWeights returns the weights of the graphs gs (the audit's upcast and
// forward graphs, which share their initializers) for sessions whose
// external-data folder is dir. declared names the model's own file in dir,
// the file the inline weights are declared to lie in (see handOver); ""
// hands no inline weight over. Close releases everything once no session
// uses them.
func NewWeights(rt *ortcapi.Runtime, dir, declared string, gs ...*onnx.GraphProto) *Weights {
	w := &Weights{rt: rt, dir: dir, declared: declared, known: map[*onnx.TensorProto]bool{},
		vals: map[*onnx.TensorProto]*ortcapi.Value{}, maps: map[string][]byte{},
		ranges: map[*onnx.TensorProto][]byte{}, dropped: map[*onnx.TensorProto]bool{}, unmappable: map[string]bool{},
		converted: map[*onnx.TensorProto][]byte{}}
	for _, g := range gs {
		for _, t := range g.GetInitializer() {
			w.known[t] = true
		}
	}
	return w
}

// Held reports whether w hands t over: one of its graphs' initializers,
// stored in an external file or inline as HandsOver takes it.
func (w *Weights) Held(t *onnx.TensorProto) bool {
	if w == nil || !w.known[t] {
		return false
	}
	if t.GetDataLocation() == onnx.TensorProto_EXTERNAL {
		return w.dir != "" && tensor.DType(t.GetDataType()).Size() > 0
	}
	return w.declared != "" && HandsOver(t)
}

// value returns the tensor over t's bytes, made on first use; nil (and no
// error) when t is not one w hands over, or its file cannot be mapped.
func (w *Weights) value(t *onnx.TensorProto) (*ortcapi.Value, error) {
	if !w.Held(t) {
		return nil, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if v, ok := w.vals[t]; ok {
		w.dropped[t] = false
		return v, nil
	}
	var data []byte
	if t.GetDataLocation() == onnx.TensorProto_EXTERNAL {
		path, off, n, err := onnx.ExternalRange(t, w.dir)
		if err != nil {
			return nil, err
		}
		size := int64(tensor.DType(t.GetDataType()).Size())
		if off%size != 0 || w.unmappable[path] {
			return nil, nil // misaligned for its kernels: ONNX Runtime reads it
		}
		m, err := w.mapped(path)
		if err != nil || m == nil {
			return nil, err
		}
		data = m[off : off+n]
		w.ranges[t] = data
		if onnx.StoredAs(t) != t.GetDataType() {
			if data, err = w.convert(t, data); err != nil {
				return nil, err
			}
		}
	} else {
		data = t.RawData
	}
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(unsafe.SliceData(data))
	}
	v, err := w.rt.NewTensor(ortcapi.ElemType(t.DataType), t.Dims, p, len(data))
	if err != nil {
		return nil, fmt.Errorf("initializer %q: %w", t.Name, err)
	}
	w.vals[t] = v
	delete(w.dropped, t)
	return v, nil
}

// convert returns the fp32 elements of a FLOAT view over the 16-bit
// bytes stored, in memory of their own (an anonymous mapping, which Drop
// and Close give back).
func (w *Weights) convert(t *onnx.TensorProto, stored []byte) ([]byte, error) {
	n := onnx.TensorBytes(t)
	if n == 0 {
		return nil, nil
	}
	buf, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("initializer %q: %d bytes of memory for its fp32 elements: %w", t.Name, n, err)
	}
	half := (*[1 << 46]uint16)(unsafe.Pointer(unsafe.SliceData(stored)))[: len(stored)/2 : len(stored)/2]
	out := (*[1 << 45]float32)(unsafe.Pointer(unsafe.SliceData(buf)))[: n/4 : n/4]
	if onnx.StoredAs(t) == int32(onnx.TensorProto_BFLOAT16) {
		for i, h := range half {
			out[i] = math.Float32frombits(uint32(h) << 16)
		}
	} else {
		for i, h := range half {
			out[i] = tensor.HalfToFloat32(h)
		}
	}
	w.converted[t] = buf
	return buf, nil
}

// release frees the fp32 memory of a converted FLOAT view and forgets
// its tensor, which the next session that needs it makes again.
func (w *Weights) release(t *onnx.TensorProto) {
	buf, ok := w.converted[t]
	if !ok {
		return
	}
	if v := w.vals[t]; v != nil {
		v.Release()
		delete(w.vals, t)
	}
	_ = syscall.Munmap(buf)
	delete(w.converted, t)
}

// mapped returns the mapping of the file at path, made on first use; nil
// when the file cannot be mapped (then ONNX Runtime reads its tensors).
func (w *Weights) mapped(path string) ([]byte, error) {
	if m, ok := w.maps[path]; ok {
		return m, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 {
		w.unmappable[path] = true
		return nil, nil
	}
	// Private and writable: a kernel writing to its weight (none should)
	// would write to its own copy of the page, never to the file.
	m, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE)
	if err != nil {
		w.unmappable[path] = true
		return nil, nil
	}
	w.maps[path] = m
	return m, nil
}

// Drop gives the pages of the mapped weights among ts back to the system
// (they stay in the page cache, so the next pass that reads them maps
// them again without reading the file): what a block run out of core
// does after its session closes, so that the process holds one block's
// weights at a time.
func (w *Weights) Drop(ts []*onnx.TensorProto) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	page := uintptr(os.Getpagesize())
	for _, t := range ts {
		w.release(t)
		r, ok := w.ranges[t]
		if !ok || len(r) == 0 {
			continue
		}
		// Whole pages inside the range only: a page shared with a
		// neighbour another block may be reading stays.
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(r)))
		skip := int((page - lo%page) % page)
		end := len(r) - int((lo+uintptr(len(r)))%page)
		if end > skip {
			_ = syscall.Madvise(r[skip:end], syscall.MADV_DONTNEED)
		}
		w.dropped[t] = true
	}
}

// Mapped returns the bytes of mapped weights handed to sessions and not
// dropped since: at most what the mappings add to the process's resident
// memory, which a memory plan must not count twice.
func (w *Weights) Mapped() int64 {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var n int64
	for t, r := range w.ranges {
		if !w.dropped[t] {
			n += int64(len(r)) + int64(len(w.converted[t]))
		}
	}
	return n
}

// Close releases the tensors and unmaps the files; no session may use
// them any more.
func (w *Weights) Close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for t, v := range w.vals {
		v.Release()
		delete(w.vals, t)
	}
	for t, buf := range w.converted {
		_ = syscall.Munmap(buf)
		delete(w.converted, t)
	}
	for p, m := range w.maps {
		_ = syscall.Munmap(m)
		delete(w.maps, p)
	}
	clear(w.ranges)
	clear(w.dropped)
}
