// Package ortcapi is a minimal binding to ONNX Runtime's C API: it loads the
// shared library at run time, creates sessions from model bytes with the
// options fp16audit needs (custom operator domains, shared initializers,
// prepacked weight sharing), and runs them on tensors whose memory the
// caller owns. It exists because onnxruntime_go exposes neither custom
// operators nor its session options pointer; see abi.h for how the ABI is
// declared and abi_test.go for how it is checked.
package ortcapi

// #cgo CFLAGS: -O2 -std=gnu11 -Wall
// #cgo LDFLAGS: -ldl
// #include <stdlib.h>
// #include "capi.h"
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Error is a failure ONNX Runtime reported: its error code (OrtErrorCode)
// and message.
type Error struct {
	Code int
	Msg  string
}

// Error returns ONNX Runtime's message.
func (e *Error) Error() string { return e.Msg }

// takeStatus turns a status into an error (nil for success) and frees it.
func takeStatus(st *C.OrtStatus) error {
	if st == nil {
		return nil
	}
	e := &Error{Code: int(C.ortc_error_code(st)), Msg: C.GoString(C.ortc_error_message(st))}
	C.ortc_release_status(st)
	return e
}

// Runtime is the loaded library and the process's ONNX Runtime environment.
type Runtime struct {
	path    string
	version string
	env     *C.OrtEnv
	cpu     *C.OrtMemoryInfo
	// huge registers the huge-page allocator with env once (hugeErr).
	huge    sync.Once
	hugeErr error
}

var loaded struct {
	mu sync.Mutex
	rt *Runtime
}

// Open loads the ONNX Runtime library at path and creates the environment,
// once per process: a later call with the same library returns the same
// Runtime, one with another library fails. It coexists with onnxruntime_go
// in one process: both open the same library file, and ONNX Runtime shares
// one environment between them.
func Open(path string) (*Runtime, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	loaded.mu.Lock()
	defer loaded.mu.Unlock()
	if rt := loaded.rt; rt != nil {
		if rt.path != abs {
			return nil, fmt.Errorf("ONNX Runtime is already loaded from %s in this process; cannot load %s as well", rt.path, abs)
		}
		return rt, nil
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("ONNX Runtime library: %w", err)
	}
	cpath := C.CString(abs)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	var version *C.char
	if C.ortc_load(cpath, &version, &msg[0], C.size_t(len(msg))) == nil {
		return nil, fmt.Errorf("load ONNX Runtime library %s: %s", abs, C.GoString(&msg[0]))
	}
	rt := &Runtime{path: abs, version: C.GoString(version)}
	err = WithoutTempFiles(func() error { return takeStatus(C.ortc_create_env(&rt.env)) })
	if err != nil {
		return nil, fmt.Errorf("create ONNX Runtime environment: %w", err)
	}
	if err := takeStatus(C.ortc_memory_info_cpu(&rt.cpu)); err != nil {
		return nil, err
	}
	loaded.rt = rt
	return rt, nil
}

// WithoutTempFiles runs fn, which creates ONNX Runtime's environment, and
// removes the files the official builds' telemetry library writes into
// the temporary folder meanwhile and never removes: a session file .ses
// (unless one was there before) and this process's empty
// mat-debug-PID.log. fp16audit leaves nothing behind, and it changes no
// process-wide setting (such as TMPDIR) to get there. Both bindings create
// their environment through it.
func WithoutTempFiles(fn func() error) error {
	dir := os.TempDir()
	ses := filepath.Join(dir, ".ses")
	_, err := os.Lstat(ses)
	hadSes := err == nil
	err = fn()
	// A file that is not there (another build, an unwritable folder) is
	// fine: there is nothing to remove.
	os.Remove(filepath.Join(dir, fmt.Sprintf("mat-debug-%d.log", os.Getpid())))
	if !hadSes {
		os.Remove(ses)
	}
	return err
}

// TooOldError is an ONNX Runtime library older than the C API version a
// binding needs.
type TooOldError struct {
	Path    string
	Version string // the library's version string
	API     int    // the OrtApi version needed: ONNX Runtime 1.API or newer
}

// Error names the library, its version and the version needed.
func (e *TooOldError) Error() string {
	return fmt.Sprintf("ONNX Runtime %s (%s) is too old: fp16audit needs ONNX Runtime 1.%d or newer (C API version %d)", e.Version, e.Path, e.API, e.API)
}

// Probe loads the library at path, without creating an environment, and
// returns its version string; a library that does not provide OrtApi
// version api (ONNX Runtime 1.api or newer) is a *TooOldError.
func Probe(path string, api int) (string, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	var version *C.char
	// A 1.x library whose minor version is below api cannot provide it;
	// asking it would print ONNX Runtime's complaint to stderr.
	if C.ortc_probe(cpath, C.uint32_t(api), 0, &version, &msg[0], C.size_t(len(msg))) < 0 {
		return "", fmt.Errorf("load ONNX Runtime library %s: %s", path, C.GoString(&msg[0]))
	}
	v := C.GoString(version)
	var major, minor int
	if n, _ := fmt.Sscanf(v, "%d.%d", &major, &minor); n == 2 && major == 1 && minor < api {
		return v, &TooOldError{Path: path, Version: v, API: api}
	}
	if C.ortc_probe(cpath, C.uint32_t(api), 1, &version, &msg[0], C.size_t(len(msg))) == 0 {
		return v, &TooOldError{Path: path, Version: v, API: api}
	}
	return v, nil
}

// Version returns the library's version string, such as "1.30.0".
func (rt *Runtime) Version() string { return rt.version }

// API returns the OrtApi function table of version ortc_api_version, for
// packages that implement custom operators in C.
func (rt *Runtime) API() unsafe.Pointer {
	return unsafe.Pointer(C.ortc_api_table())
}

// Level is ONNX Runtime's graph optimization level (GraphOptimizationLevel).
type Level int

// The optimization levels.
const (
	LevelNone     Level = 0
	LevelBasic    Level = 1
	LevelExtended Level = 2
	LevelAll      Level = 99
)

// ParseLevel maps the names fp16audit uses ("none", "basic", "extended",
// "all"; "" is "all") to levels.
func ParseLevel(s string) (Level, error) {
	switch s {
	case "", "all":
		return LevelAll, nil
	case "extended":
		return LevelExtended, nil
	case "basic":
		return LevelBasic, nil
	case "none":
		return LevelNone, nil
	}
	return 0, fmt.Errorf("optimization level %q: want all, extended, basic or none", s)
}

// CustomOpDomain is a domain of custom operators. ONNX Runtime keeps
// pointers to it and to its operators in every session that uses it, so a
// domain lives as long as the process.
type CustomOpDomain struct {
	p *C.OrtCustomOpDomain
}

// NewCustomOpDomain creates the domain name holding ops, each a pointer to
// an OrtCustomOp (see ortc_custom_op in abi.h) in C memory that stays valid
// for the life of the process.
func (rt *Runtime) NewCustomOpDomain(name string, ops ...unsafe.Pointer) (*CustomOpDomain, error) {
	cname := C.CString(name)
	// ONNX Runtime copies the name; the string is freed here.
	defer C.free(unsafe.Pointer(cname))
	d := &CustomOpDomain{}
	if err := takeStatus(C.ortc_domain_new(cname, &d.p)); err != nil {
		return nil, err
	}
	for _, op := range ops {
		if err := takeStatus(C.ortc_domain_add(d.p, op)); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// PrepackedWeights lets sessions share the copies of weights that kernels
// such as MatMul and Conv repack at session creation.
type PrepackedWeights struct {
	p *C.OrtPrepackedWeightsContainer
}

// NewPrepackedWeights returns an empty container; Release it after every
// session created with it is closed.
func (rt *Runtime) NewPrepackedWeights() (*PrepackedWeights, error) {
	c := &PrepackedWeights{}
	if err := takeStatus(C.ortc_prepacked_new(&c.p)); err != nil {
		return nil, err
	}
	return c, nil
}

// Release frees the container.
func (c *PrepackedWeights) Release() {
	if c.p != nil {
		C.ortc_prepacked_release(c.p)
		c.p = nil
	}
}

// Options configures NewSession.
type Options struct {
	// Threads is the number of intra-op threads; 0 leaves ONNX Runtime's
	// default (one per physical core).
	Threads int
	Level   Level
	// NoMemPattern switches ONNX Runtime's memory patterns off. With them
	// on, the first run traces its allocations and the next one lays them
	// out in one fresh block, so the first two runs both touch new memory
	// (measured: a backward graph's first two runs cost 3–10 times the
	// third); a session run only a few times is faster without.
	NoMemPattern bool
	// Config holds session configuration entries (AddSessionConfigEntry),
	// such as "session.intra_op.allow_spinning": "0".
	Config map[string]string
	// Domains are the custom operator domains the model may use.
	Domains []*CustomOpDomain
	// Initializers replace the model's initializers of the same names with
	// tensors the caller owns, which several sessions can share; each must
	// outlive every session created with it.
	Initializers map[string]*Value
	// Prepacked, when set, shares repacked weights with the other sessions
	// created with the same container.
	Prepacked *PrepackedWeights
	// HugePages allocates the session's memory from an allocator the
	// sessions created with it share in place of ONNX Runtime's arena
	// (huge.c): blocks from 64 KiB up lie in transparent huge pages, one
	// page fault per 2 MiB instead of 512, and a freed block is kept for
	// the next allocation of about its size, in this session or another,
	// until the last session with HugePages closes. For a session run a
	// few times, whose first run would otherwise fault its whole working
	// set in page by page.
	HugePages bool
}

// Session is a model loaded into ONNX Runtime with fixed input and output
// names. Run may be called from several goroutines at once.
type Session struct {
	rt       *Runtime
	mu       sync.RWMutex // Run and stop hold it shared, Close exclusively
	p        *C.OrtSession
	ro       *C.OrtRunOptions // every Run's options; stop terminates them
	inNames  []string
	outNames []string
	cIn      **C.char // C arrays of the names, for every Run
	cOut     **C.char
	// huge is set for a session created with Options.HugePages.
	huge bool
	// stopped holds the cause the session's runs were stopped with.
	stopped atomic.Pointer[error]
}

// NewSession creates a session from the bytes of an ONNX model.
func (rt *Runtime) NewSession(model []byte, inputs, outputs []string, o Options) (*Session, error) {
	if len(model) == 0 {
		return nil, errors.New("empty model")
	}
	var so *C.OrtSessionOptions
	if err := takeStatus(C.ortc_options_new(&so)); err != nil {
		return nil, err
	}
	defer C.ortc_options_release(so)
	var cstrs []*C.char
	defer func() {
		for _, s := range cstrs {
			C.free(unsafe.Pointer(s))
		}
	}()
	cstr := func(s string) *C.char {
		c := C.CString(s)
		cstrs = append(cstrs, c)
		return c
	}
	if o.Threads > 0 {
		if err := takeStatus(C.ortc_options_threads(so, C.int(o.Threads))); err != nil {
			return nil, err
		}
	}
	if err := takeStatus(C.ortc_options_level(so, C.int(o.Level))); err != nil {
		return nil, err
	}
	if o.NoMemPattern {
		if err := takeStatus(C.ortc_options_no_mem_pattern(so)); err != nil {
			return nil, err
		}
	}
	for k, v := range o.Config {
		if err := takeStatus(C.ortc_options_config(so, cstr(k), cstr(v))); err != nil {
			return nil, err
		}
	}
	for _, d := range o.Domains {
		if err := takeStatus(C.ortc_options_domain(so, d.p)); err != nil {
			return nil, err
		}
	}
	for name, v := range o.Initializers {
		if err := takeStatus(C.ortc_options_initializer(so, cstr(name), v.p)); err != nil {
			return nil, fmt.Errorf("initializer %q: %w", name, err)
		}
	}
	var prepacked *C.OrtPrepackedWeightsContainer
	if o.Prepacked != nil {
		prepacked = o.Prepacked.p
	}
	s := &Session{rt: rt, inNames: append([]string(nil), inputs...), outNames: append([]string(nil), outputs...)}
	if o.HugePages {
		rt.huge.Do(func() { rt.hugeErr = takeStatus(C.ortc_huge_register(rt.env)) })
		if rt.hugeErr != nil {
			return nil, fmt.Errorf("register the huge-page allocator: %w", rt.hugeErr)
		}
		if err := takeStatus(C.ortc_options_config(so, cstr("session.use_env_allocators"), cstr("1"))); err != nil {
			return nil, err
		}
		C.ortc_huge_acquire()
		s.huge = true
	}
	// The model bytes are only read during the call.
	err := takeStatus(C.ortc_session_new(rt.env, unsafe.Pointer(unsafe.SliceData(model)), C.size_t(len(model)), so, prepacked, &s.p))
	if err != nil {
		s.releaseHuge()
		return nil, err
	}
	if err := takeStatus(C.ortc_run_options_new(&s.ro)); err != nil {
		C.ortc_session_release(s.p)
		s.releaseHuge()
		return nil, err
	}
	s.cIn = cStrings(inputs)
	s.cOut = cStrings(outputs)
	return s, nil
}

// cStrings copies names into a malloc'ed array of malloc'ed strings.
func cStrings(names []string) **C.char {
	arr := (**C.char)(C.malloc(C.size_t(max(len(names), 1)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	s := unsafe.Slice(arr, max(len(names), 1))
	for i, n := range names {
		s[i] = C.CString(n)
	}
	return arr
}

func freeCStrings(arr **C.char, n int) {
	for _, p := range unsafe.Slice(arr, max(n, 1))[:n] {
		C.free(unsafe.Pointer(p))
	}
	C.free(unsafe.Pointer(arr))
}

// Inputs and Outputs return the session's input and output names.
func (s *Session) Inputs() []string  { return s.inNames }
func (s *Session) Outputs() []string { return s.outNames }

// Close releases the session, after runs in flight.
func (s *Session) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return
	}
	C.ortc_session_release(s.p)
	C.ortc_run_options_release(s.ro)
	s.p, s.ro = nil, nil
	s.releaseHuge()
	freeCStrings(s.cIn, len(s.inNames))
	freeCStrings(s.cOut, len(s.outNames))
}

// releaseHuge ends the session's use of the huge-page allocator, after
// ONNX Runtime freed the session's memory into it.
func (s *Session) releaseHuge() {
	if s.huge {
		C.ortc_huge_release()
		s.huge = false
	}
}

// AdviseHugePages asks the kernel to back the memory of b that spans whole
// transparent huge pages (2 MiB) by huge pages when it is first touched:
// for a large buffer of fresh memory, such as the outputs a session writes
// into, one page fault per 2 MiB instead of 512. It is advice; a kernel
// without transparent huge pages ignores it.
func AdviseHugePages(b []byte) {
	if len(b) > 0 {
		C.ortc_huge_advise(unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b)))
	}
}

// hugeStats reads the huge-page allocator's state, for the tests.
type hugeState struct {
	// inUse and kept are the bytes of the blocks mapped on their own in
	// use and kept for later allocations; slabs counts the huge pages
	// carved into smaller blocks, and slabFree the blocks kept free there.
	inUse, kept, slabs, slabFree int64
}

func hugeStats() hugeState {
	var u, c, s, f C.size_t
	C.ortc_huge_stats(&u, &c, &s, &f)
	return hugeState{int64(u), int64(c), int64(s), int64(f)}
}

// StopOn stops the session's runs when ctx ends: ONNX Runtime ends the run
// in flight at its next node (through its run options' terminate flag),
// and it and every later Run return an error that wraps ctx's cause. The
// function returned detaches ctx, as context.AfterFunc's does. A ctx that
// has already ended stops the session before StopOn returns (AfterFunc
// would stop it on a goroutine of its own, maybe after the next Run began).
func (s *Session) StopOn(ctx context.Context) (detach func() bool) {
	if ctx.Err() != nil {
		s.stop(context.Cause(ctx))
		return func() bool { return false }
	}
	return context.AfterFunc(ctx, func() { s.stop(context.Cause(ctx)) })
}

// stop terminates the runs of s with cause.
func (s *Session) stop(cause error) {
	s.stopped.CompareAndSwap(nil, &cause)
	s.terminate()
}

// terminate sets the terminate flag of the session's run options.
func (s *Session) terminate() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ro != nil {
		// The flag is only ever set: an error setting it leaves the run to
		// finish, and the stopped cause still fails every later one.
		if st := C.ortc_run_options_terminate(s.ro); st != nil {
			C.ortc_release_status(st)
		}
	}
}

// stoppedErr returns the error of a run of a stopped session, nil when the
// session was not stopped.
func (s *Session) stoppedErr() error {
	if c := s.stopped.Load(); c != nil {
		return fmt.Errorf("run stopped: %w", *c)
	}
	return nil
}

// Run runs the model on inputs (in input-name order). outputs has one entry
// per output name: a non-nil entry is a tensor ONNX Runtime writes into, a
// nil entry receives a value ONNX Runtime allocates, which the caller
// releases.
func (s *Session) Run(inputs, outputs []*Value) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.p == nil {
		return errors.New("run: session is closed")
	}
	if err := s.stoppedErr(); err != nil {
		return err
	}
	if len(inputs) != len(s.inNames) || len(outputs) != len(s.outNames) {
		return fmt.Errorf("run: want %d inputs and %d outputs, got %d and %d", len(s.inNames), len(s.outNames), len(inputs), len(outputs))
	}
	// The value pointer arrays live in C memory: Go memory passed to C
	// must not hold Go pointers, and ONNX Runtime writes the outputs.
	n := len(inputs) + len(outputs)
	arr := (**C.OrtValue)(C.ortc_calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof(uintptr(0)))))
	if arr == nil {
		return fmt.Errorf("run: the %d value pointers: out of memory", n)
	}
	defer C.free(unsafe.Pointer(arr))
	vals := unsafe.Slice(arr, max(n, 1))
	for i, v := range inputs {
		if v == nil || v.p == nil {
			return fmt.Errorf("run: input %q is nil or released", s.inNames[i])
		}
		vals[i] = v.p
	}
	for i, v := range outputs {
		if v != nil {
			vals[len(inputs)+i] = v.p
		}
	}
	out := (**C.OrtValue)(unsafe.Add(unsafe.Pointer(arr), uintptr(len(inputs))*unsafe.Sizeof(uintptr(0))))
	err := takeStatus(C.ortc_run(s.p, s.ro, s.cIn, arr, C.size_t(len(inputs)), s.cOut, C.size_t(len(outputs)), out))
	runtime.KeepAlive(inputs)
	if err != nil {
		if serr := s.stoppedErr(); serr != nil {
			return serr
		}
		return err
	}
	for i := range outputs {
		if outputs[i] == nil {
			outputs[i] = newValue(vals[len(inputs)+i], nil)
		}
	}
	return nil
}

// ElemType is an ONNX tensor element type (TensorProto.DataType).
type ElemType int

// The element types this package creates tensors of.
const (
	Float32  ElemType = 1
	Uint8    ElemType = 2
	Int8     ElemType = 3
	Uint16   ElemType = 4
	Int16    ElemType = 5
	Int32    ElemType = 6
	Int64    ElemType = 7
	Bool     ElemType = 9
	Float16  ElemType = 10
	Float64  ElemType = 11
	Uint32   ElemType = 12
	Uint64   ElemType = 13
	BFloat16 ElemType = 16
)

// Value is an ONNX Runtime tensor: over memory the caller owns (NewTensor)
// or over memory ONNX Runtime allocated for an output. Release frees it; a
// Value dropped without Release is freed when the garbage collector finds
// it unreachable, never with an abort (an unreleased runtime.Pinner would
// be one).
type Value struct {
	*value
	cleanup runtime.Cleanup
}

// value is what a Value owns, apart from the Value itself so that the
// Value's cleanup can free it.
type value struct {
	p   *C.OrtValue
	pin *runtime.Pinner // nil for ONNX Runtime's own memory
}

// collected counts the values freed by their cleanup, for the tests.
var collected atomic.Int64

// newValue returns a Value owning p and, when pin is not nil, the pinning
// of the Go memory p's tensor reads.
func newValue(p *C.OrtValue, pin *runtime.Pinner) *Value {
	v := &Value{value: &value{p: p, pin: pin}}
	v.cleanup = runtime.AddCleanup(v, func(o *value) {
		o.free()
		collected.Add(1)
	}, v.value)
	return v
}

// free releases the ONNX Runtime side and unpins the memory.
func (o *value) free() {
	if o.p != nil {
		C.ortc_value_release(o.p)
		o.p = nil
	}
	if o.pin != nil {
		o.pin.Unpin()
		o.pin = nil
	}
}

// NewTensor wraps data, the little-endian elements of a tensor of type t and
// shape, without copying. Go memory is pinned until Release; the caller must
// neither move nor free C or mapped memory before then.
func (rt *Runtime) NewTensor(t ElemType, shape []int64, data unsafe.Pointer, nbytes int) (*Value, error) {
	for _, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("negative dimension in shape %v", shape)
		}
	}
	var pin *runtime.Pinner
	if nbytes == 0 || data == nil {
		// ONNX Runtime wants a non-NULL pointer even for no elements; it
		// never reads it.
		data = unsafe.Pointer(&C.ortc_empty)
		nbytes = 0
	} else {
		pin = new(runtime.Pinner)
		pin.Pin(data)
	}
	// ONNX Runtime copies the shape: Go memory without pointers serves for
	// the call.
	var cshape *C.int64_t
	if len(shape) > 0 {
		cshape = (*C.int64_t)(unsafe.Pointer(&shape[0]))
	}
	var p *C.OrtValue
	err := takeStatus(C.ortc_tensor_new(rt.cpu, data, C.size_t(nbytes), cshape, C.size_t(len(shape)), C.int(t), &p))
	runtime.KeepAlive(shape)
	if err != nil {
		if pin != nil {
			pin.Unpin()
		}
		return nil, err
	}
	return newValue(p, pin), nil
}

// Release frees the ONNX Runtime side of v and unpins its memory.
func (v *Value) Release() {
	if v == nil || v.value == nil {
		return
	}
	v.cleanup.Stop()
	v.free()
}

// Info returns the tensor's element type and shape.
func (v *Value) Info() (ElemType, []int64, error) {
	var t C.int
	var rank, count C.size_t
	var dims [16]C.int64_t
	if err := takeStatus(C.ortc_tensor_info(v.p, &t, &rank, &count, &dims[0], C.size_t(len(dims)))); err != nil {
		return 0, nil, err
	}
	if int(rank) > len(dims) {
		big := make([]C.int64_t, rank)
		// The dims buffer is Go memory without Go pointers: fine for the
		// duration of the call.
		if err := takeStatus(C.ortc_tensor_info(v.p, &t, &rank, &count, &big[0], rank)); err != nil {
			return 0, nil, err
		}
		return ElemType(t), int64s(big), nil
	}
	return ElemType(t), int64s(dims[:rank]), nil
}

func int64s(d []C.int64_t) []int64 {
	out := make([]int64, len(d))
	for i, x := range d {
		out[i] = int64(x)
	}
	return out
}

// Data returns the address of the tensor's elements; it stays valid while
// v does.
func (v *Value) Data() (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if err := takeStatus(C.ortc_tensor_data(v.p, &p)); err != nil {
		return nil, err
	}
	return p, nil
}

// failAllocs makes the n-th allocation of the C side from now fail (0:
// none), so that the tests reach the out-of-memory paths.
func failAllocs(n int) { C.ortc_fail_allocs(C.int(n)) }
