package onnxrt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	ort "github.com/yalue/onnxruntime_go"

	"fp16audit/internal/tensor"
)

// Stages of a RuntimeError.
const (
	StageOptions  = "session options"
	StageProvider = "execution provider"
	StageCreate   = "create session"
	StageRun      = "run"
)

// RuntimeError reports that ONNX Runtime refused a model or failed to run it.
// Stage is one of the Stage constants; Err keeps ONNX Runtime's own message.
type RuntimeError struct {
	Stage string
	Err   error
}

// Error returns the stage and ONNX Runtime's message.
func (e *RuntimeError) Error() string { return e.Stage + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *RuntimeError) Unwrap() error { return e.Err }

// externalDataKey is the session config entry that tells ONNX Runtime where
// the external data of a model loaded from bytes lives.
const externalDataKey = "session.model_external_initializers_file_folder_path"

// cudaProviderLibraries must sit beside libonnxruntime.so for the CUDA
// execution provider to load.
var cudaProviderLibraries = []string{"libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so"}

// SessionOptions configures NewSession.
type SessionOptions struct {
	// Threads is the number of intra-op threads; 0 leaves ONNX Runtime's
	// default (one per physical core).
	Threads int
	// Device is "cpu" (the default when empty) or "cuda".
	Device string
	// ExternalDataDir is the folder the model's external data locations are
	// relative to, usually the folder of the .onnx file.
	ExternalDataDir string
	// Optimization is ONNX Runtime's graph optimization level: "all" (the
	// default when empty), "extended", "basic" or "none". Fusions change
	// rounding (Conv+BatchNorm folding, NCHWc kernels), so two sessions
	// compare bit for bit only at the same level with the same fusions
	// possible; "none" makes every node compute as written.
	Optimization string
	// NoSpinning stops ONNX Runtime's intra-op threads from spinning while
	// they wait for work: spinning keeps every core busy between and
	// after kernels, which starves whatever else the process computes at
	// the same time.
	NoSpinning bool
}

var optimizationLevels = map[string]ort.GraphOptimizationLevel{
	"":         ort.GraphOptimizationLevelEnableAll,
	"all":      ort.GraphOptimizationLevelEnableAll,
	"extended": ort.GraphOptimizationLevelEnableExtended,
	"basic":    ort.GraphOptimizationLevelEnableBasic,
	"none":     ort.GraphOptimizationLevelDisableAll,
}

// Session is a model loaded into ONNX Runtime with fixed input and output
// names. Run may be called from several goroutines at once.
type Session struct {
	mu          sync.RWMutex // Run and stop hold it shared, Close exclusively
	s           *ort.DynamicAdvancedSession
	ro          *ort.RunOptions // every run's options; stop terminates them
	stopped     atomic.Pointer[error]
	inputNames  []string
	outputNames []string
	inputTypes  []valueType // declared, in inputNames order
	outputTypes []valueType // declared, in outputNames order

	// scalars holds the element type of outputs a run found to be rank 0
	// although the graph declares no shape for them: onnxruntime_go cannot
	// read such outputs when ONNX Runtime allocates them, so later runs
	// preallocate them as scalars.
	scalarMu sync.Mutex
	scalars  map[int]tensor.DType
}

// NewSession creates a session from the bytes of an ONNX model. Run takes
// inputs in inputNames order and returns outputs in outputNames order.
// Failures of ONNX Runtime are *RuntimeError values.
func NewSession(model []byte, inputNames, outputNames []string, opt SessionOptions) (*Session, error) {
	lib := loadedLibrary()
	if lib == "" {
		return nil, errors.New("ONNX Runtime is not initialized; call runtime.Init first")
	}
	if len(inputNames) == 0 || len(outputNames) == 0 {
		return nil, fmt.Errorf("a session needs at least one input and one output name, got %d and %d", len(inputNames), len(outputNames))
	}
	if opt.Threads < 0 {
		return nil, fmt.Errorf("threads: want 0 (default) or more, got %d", opt.Threads)
	}
	so, err := ort.NewSessionOptions()
	if err != nil {
		return nil, &RuntimeError{StageOptions, innermost(err)}
	}
	defer so.Destroy()
	if opt.Threads > 0 {
		if err := so.SetIntraOpNumThreads(opt.Threads); err != nil {
			return nil, &RuntimeError{StageOptions, innermost(err)}
		}
	}
	if opt.NoSpinning {
		if err := so.AddSessionConfigEntry("session.intra_op.allow_spinning", "0"); err != nil {
			return nil, &RuntimeError{StageOptions, innermost(err)}
		}
	}
	level, ok := optimizationLevels[opt.Optimization]
	if !ok {
		return nil, fmt.Errorf("optimization level %q: want all, extended, basic or none", opt.Optimization)
	}
	if err := so.SetGraphOptimizationLevel(level); err != nil {
		return nil, &RuntimeError{StageOptions, innermost(err)}
	}
	if opt.ExternalDataDir != "" {
		dir, err := filepath.Abs(opt.ExternalDataDir)
		if err != nil {
			return nil, fmt.Errorf("external data folder %s: %w", opt.ExternalDataDir, err)
		}
		if err := so.AddSessionConfigEntry(externalDataKey, dir); err != nil {
			return nil, &RuntimeError{StageOptions, innermost(err)}
		}
	}
	switch opt.Device {
	case "", "cpu":
	case "cuda":
		if err := appendCUDA(so, lib); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("device %q: want cpu or cuda", opt.Device)
	}
	ds, err := ort.NewDynamicAdvancedSessionWithONNXData(model, inputNames, outputNames, so)
	if err != nil {
		inner := innermost(err)
		if strings.Contains(inner.Error(), "protobuf parsing failed") {
			// The model parsed in Go; ONNX Runtime's C++ protobuf parser
			// stops at 100 levels of message nesting.
			inner = fmt.Errorf("%v (ONNX Runtime's protobuf parser refuses messages nested over 100 levels deep, "+
				"which If/Loop/Scan subgraphs nested about 30 deep reach; flatten the control flow)", inner)
		}
		return nil, &RuntimeError{StageCreate, inner}
	}
	ro, err := ort.NewRunOptions()
	if err != nil {
		ds.Destroy()
		return nil, &RuntimeError{StageOptions, innermost(err)}
	}
	s := &Session{
		s:           ds,
		ro:          ro,
		inputNames:  append([]string(nil), inputNames...),
		outputNames: append([]string(nil), outputNames...),
		inputTypes:  make([]valueType, len(inputNames)),
		outputTypes: make([]valueType, len(outputNames)),
	}
	// ONNX Runtime has accepted the model, so its signature parses; the
	// declared types only steer how outputs are allocated.
	if ins, outs, err := readSignature(model); err == nil {
		for i, n := range inputNames {
			s.inputTypes[i] = ins[n]
		}
		for i, n := range outputNames {
			s.outputTypes[i] = outs[n]
		}
	}
	return s, nil
}

func appendCUDA(so *ort.SessionOptions, lib string) error {
	co, err := ort.NewCUDAProviderOptions()
	if err == nil {
		defer co.Destroy()
		err = so.AppendExecutionProviderCUDA(co)
	}
	if err == nil {
		return nil
	}
	dir := filepath.Dir(lib)
	var missing []string
	for _, name := range cudaProviderLibraries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			missing = append(missing, name)
		}
	}
	msg := fmt.Sprintf("CUDA execution provider unavailable: %v", innermost(err))
	if len(missing) > 0 {
		msg += fmt.Sprintf("; it needs %s beside %s, missing: %s (the onnxruntime-node build that `make ort` installs ships none: it is CPU only); "+
			"install ONNX Runtime's linux-x64 GPU release and pass its libonnxruntime.so.1 with --ort-lib, or use the cpu device",
			strings.Join(cudaProviderLibraries, " and "), dir, strings.Join(missing, ", "))
	}
	return &RuntimeError{StageProvider, errors.New(msg)}
}

// Close releases the session. It waits for runs in flight.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil
	}
	err := s.s.Destroy()
	if rerr := s.ro.Destroy(); err == nil {
		err = rerr
	}
	s.s, s.ro = nil, nil
	return err
}

// StopOn stops the session's runs when ctx ends: ONNX Runtime ends the run
// in flight at its next node (through its run options' terminate flag),
// and it and every later Run return an error that wraps ctx's cause. The
// function returned detaches ctx, as context.AfterFunc's does. A ctx that
// has already ended stops the session before StopOn returns.
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
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ro != nil {
		// The flag is only ever set: should setting it fail, the run
		// finishes and the stopped cause still fails every later one.
		_ = s.ro.Terminate()
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

// Run runs the model on inputs (in inputNames order) and returns the outputs
// in outputNames order. Float32 and float64 outputs come back as Float32,
// float16 and bfloat16 outputs as raw bits, integer and bool outputs in their
// own type. ONNX Runtime failures are *RuntimeError values.
func (s *Session) Run(inputs []*tensor.Tensor) ([]*tensor.Tensor, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	in, err := s.inputValues(inputs)
	if err != nil {
		return nil, err
	}
	defer destroyAll(in)
	out := make([]ort.Value, len(s.outputNames))
	defer func() { destroyAll(out) }()
	params := bindParams(s.inputTypes, inputs)
	// Each failed attempt finds one more undeclared rank-0 output.
	for attempt := 0; attempt <= len(out); attempt++ {
		destroyAll(out)
		clear(out)
		for i, vt := range s.outputTypes {
			v, err := s.preallocate(i, vt, params)
			if err != nil {
				return nil, fmt.Errorf("output %q: %w", s.outputNames[i], err)
			}
			out[i] = v
		}
		allocated := slices.Clone(out)
		err = s.s.RunWithOptions(in, out, s.ro)
		goruntime.KeepAlive(inputs)
		if err == nil || !errors.Is(err, ort.ZeroShapeLengthError) || !s.learnScalar(allocated, out) {
			break
		}
	}
	if err != nil {
		if serr := s.stoppedErr(); serr != nil {
			return nil, serr
		}
		inner := innermost(err)
		if strings.HasPrefix(err.Error(), "Error creating tensor from ort") {
			// onnxruntime_go could not copy an output ONNX Runtime allocated:
			// its copy of float16/bfloat16 data is half the size it needs,
			// and it rejects rank-0 tensors.
			return nil, &RuntimeError{StageRun, fmt.Errorf("read outputs: %v; a float16, bfloat16 or scalar output "+
				"needs its shape declared in the graph (or cast it to float in the graph)", inner)}
		}
		return nil, &RuntimeError{StageRun, inner}
	}
	res := make([]*tensor.Tensor, len(out))
	for i, v := range out {
		t, err := fromValue(v)
		if err != nil {
			return nil, fmt.Errorf("output %q: %w", s.outputNames[i], err)
		}
		t.Name = s.outputNames[i]
		res[i] = t
	}
	return res, nil
}

// inputValues wraps inputs (in inputNames order) as ONNX Runtime values
// over their own memory; the caller destroys them. It must be called with
// s.mu held.
func (s *Session) inputValues(inputs []*tensor.Tensor) ([]ort.Value, error) {
	if s.s == nil {
		return nil, errors.New("run: session is closed")
	}
	if err := s.stoppedErr(); err != nil {
		return nil, err
	}
	if len(inputs) != len(s.inputNames) {
		return nil, fmt.Errorf("run: want %d inputs (%s), got %d", len(s.inputNames), strings.Join(s.inputNames, ", "), len(inputs))
	}
	in := make([]ort.Value, len(inputs))
	for i, t := range inputs {
		v, err := toValue(t)
		if err != nil {
			destroyAll(in)
			return nil, fmt.Errorf("input %q: %w", s.inputNames[i], err)
		}
		in[i] = v
	}
	return in, nil
}

// destroyAll releases the ONNX Runtime side of every value. A failed output
// conversion in onnxruntime_go leaves a typed nil behind, hence reflect.
func destroyAll(vs []ort.Value) {
	for _, v := range vs {
		if v != nil && !reflect.ValueOf(v).IsNil() {
			v.Destroy()
		}
	}
}

// preallocate is the package's preallocate, with the rank-0 outputs earlier
// runs found preallocated as scalars.
func (s *Session) preallocate(i int, vt valueType, params map[string]int64) (ort.Value, error) {
	s.scalarMu.Lock()
	d, ok := s.scalars[i]
	s.scalarMu.Unlock()
	if ok {
		return newScalar(d, nil)
	}
	return preallocate(vt, params)
}

// learnScalar records the output whose conversion failed after a run: the
// first one ONNX Runtime allocated (nil in allocated) that onnxruntime_go
// left as a typed nil. It reports whether there was one.
func (s *Session) learnScalar(allocated, out []ort.Value) bool {
	for i, v := range out {
		if allocated[i] != nil || v == nil || !reflect.ValueOf(v).IsNil() {
			continue
		}
		d, ok := scalarTypes[reflect.TypeOf(v)]
		if !ok {
			return false
		}
		s.scalarMu.Lock()
		if s.scalars == nil {
			s.scalars = map[int]tensor.DType{}
		}
		s.scalars[i] = d
		s.scalarMu.Unlock()
		return true
	}
	return false
}

// scalarTypes maps the Go types of onnxruntime_go's tensors to element types.
var scalarTypes = map[reflect.Type]tensor.DType{
	reflect.TypeFor[*ort.Tensor[float32]](): tensor.Float32,
	reflect.TypeFor[*ort.Tensor[float64]](): tensor.Float64,
	reflect.TypeFor[*ort.Tensor[int64]]():   tensor.Int64,
	reflect.TypeFor[*ort.Tensor[int32]]():   tensor.Int32,
	reflect.TypeFor[*ort.Tensor[int16]]():   tensor.Int16,
	reflect.TypeFor[*ort.Tensor[int8]]():    tensor.Int8,
	reflect.TypeFor[*ort.Tensor[uint64]]():  tensor.Uint64,
	reflect.TypeFor[*ort.Tensor[uint32]]():  tensor.Uint32,
	reflect.TypeFor[*ort.Tensor[uint16]]():  tensor.Uint16,
	reflect.TypeFor[*ort.Tensor[uint8]]():   tensor.Uint8,
	reflect.TypeFor[*ort.Tensor[bool]]():    tensor.Bool,
}

// preallocate returns an output buffer for the outputs onnxruntime_go cannot
// copy when ONNX Runtime allocates them (float16, bfloat16 and rank-0
// tensors), or nil to let ONNX Runtime allocate.
func preallocate(vt valueType, params map[string]int64) (ort.Value, error) {
	half := vt.dtype == tensor.Float16 || vt.dtype == tensor.BFloat16
	scalar := vt.known && len(vt.dims) == 0 && vt.dtype != tensor.Undefined
	if !half && !scalar {
		return nil, nil
	}
	shape, ok := vt.resolve(params)
	if !ok {
		return nil, fmt.Errorf("%s output of shape not known before the run (ONNX Runtime's own allocation "+
			"of %s outputs cannot be read through onnxruntime_go); cast it to float in the graph", vt.dtype, vt.dtype)
	}
	if len(shape) == 0 {
		return newScalar(vt.dtype, nil)
	}
	// onnxruntime_go wants at least one byte even for an empty tensor.
	buf := alignedBytes(max(tensor.NumElements(shape)*int64(vt.dtype.Size()), 1))
	return ort.NewCustomDataTensor(ort.NewShape(shape...), buf, ort.TensorElementDataType(vt.dtype))
}

// toValue wraps t's bytes in an ONNX Runtime value without copying them,
// except for scalars and misaligned data.
func toValue(t *tensor.Tensor) (ort.Value, error) {
	size := t.DType.Size()
	if size == 0 || t.DType == tensor.String {
		return nil, fmt.Errorf("element type %s is not supported", t.DType)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return nil, fmt.Errorf("negative dimension in shape %s", tensor.ShapeString(t.Shape))
		}
	}
	n := t.Elements()
	if int64(len(t.Data)) != n*int64(size) {
		return nil, fmt.Errorf("shape %s of %s needs %d bytes, got %d", tensor.ShapeString(t.Shape), t.DType, n*int64(size), len(t.Data))
	}
	if len(t.Shape) == 0 {
		return newScalar(t.DType, t.Data)
	}
	data := t.Data
	if n == 0 {
		data = alignedBytes(1)
	} else if uintptr(unsafe.Pointer(&data[0]))%uintptr(size) != 0 {
		data = alignedBytes(int64(len(data)))
		copy(data, t.Data)
	}
	return ort.NewCustomDataTensor(ort.NewShape(t.Shape...), data, ort.TensorElementDataType(t.DType))
}

// newScalar returns a rank-0 value holding the element in data (or zero when
// data is nil). onnxruntime_go's typed Scalar is the only way to make one, so
// float16 and bfloat16 scalars are not supported.
func newScalar(d tensor.DType, data []byte) (ort.Value, error) {
	buf := alignedBytes(8)
	copy(buf, data)
	p := unsafe.Pointer(&buf[0])
	switch d {
	case tensor.Float32:
		return ort.NewScalar(*(*float32)(p))
	case tensor.Float64:
		return ort.NewScalar(*(*float64)(p))
	case tensor.Int64:
		return ort.NewScalar(*(*int64)(p))
	case tensor.Int32:
		return ort.NewScalar(*(*int32)(p))
	case tensor.Int16:
		return ort.NewScalar(*(*int16)(p))
	case tensor.Int8:
		return ort.NewScalar(*(*int8)(p))
	case tensor.Uint64:
		return ort.NewScalar(*(*uint64)(p))
	case tensor.Uint32:
		return ort.NewScalar(*(*uint32)(p))
	case tensor.Uint16:
		return ort.NewScalar(*(*uint16)(p))
	case tensor.Uint8:
		return ort.NewScalar(*(*uint8)(p))
	case tensor.Bool:
		return ort.NewScalar(*(*uint8)(p) != 0)
	}
	return nil, fmt.Errorf("rank-0 %s tensors are not supported (onnxruntime_go has no such scalar); reshape to [1]", d)
}

// fromValue converts an output value into a tensor. Data aliases the Go
// memory onnxruntime_go already holds; only float64 is converted.
func fromValue(v ort.Value) (*tensor.Tensor, error) {
	shape := []int64(v.GetShape())
	if shape == nil {
		shape = []int64{}
	}
	switch x := v.(type) {
	case *ort.Tensor[float32]:
		return &tensor.Tensor{DType: tensor.Float32, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[float64]:
		return &tensor.Tensor{DType: tensor.Float32, Shape: shape, Data: asBytes(narrow(x.GetData()))}, nil
	case *ort.Tensor[int64]:
		return &tensor.Tensor{DType: tensor.Int64, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[int32]:
		return &tensor.Tensor{DType: tensor.Int32, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[int16]:
		return &tensor.Tensor{DType: tensor.Int16, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[int8]:
		return &tensor.Tensor{DType: tensor.Int8, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[uint64]:
		return &tensor.Tensor{DType: tensor.Uint64, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[uint32]:
		return &tensor.Tensor{DType: tensor.Uint32, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[uint16]:
		return &tensor.Tensor{DType: tensor.Uint16, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.Tensor[uint8]:
		return &tensor.Tensor{DType: tensor.Uint8, Shape: shape, Data: x.GetData()}, nil
	case *ort.Tensor[bool]:
		return &tensor.Tensor{DType: tensor.Bool, Shape: shape, Data: asBytes(x.GetData())}, nil
	case *ort.CustomDataTensor:
		d := tensor.DType(x.DataType())
		n := tensor.NumElements(shape) * int64(d.Size())
		return &tensor.Tensor{DType: d, Shape: shape, Data: x.GetData()[:n]}, nil
	case *ort.Scalar[float32]:
		return scalarTensor(tensor.Float32, x.GetData()), nil
	case *ort.Scalar[float64]:
		return scalarTensor(tensor.Float32, float32(x.GetData())), nil
	case *ort.Scalar[int64]:
		return scalarTensor(tensor.Int64, x.GetData()), nil
	case *ort.Scalar[int32]:
		return scalarTensor(tensor.Int32, x.GetData()), nil
	case *ort.Scalar[int16]:
		return scalarTensor(tensor.Int16, x.GetData()), nil
	case *ort.Scalar[int8]:
		return scalarTensor(tensor.Int8, x.GetData()), nil
	case *ort.Scalar[uint64]:
		return scalarTensor(tensor.Uint64, x.GetData()), nil
	case *ort.Scalar[uint32]:
		return scalarTensor(tensor.Uint32, x.GetData()), nil
	case *ort.Scalar[uint16]:
		return scalarTensor(tensor.Uint16, x.GetData()), nil
	case *ort.Scalar[uint8]:
		return scalarTensor(tensor.Uint8, x.GetData()), nil
	case *ort.Scalar[bool]:
		return scalarTensor(tensor.Bool, x.GetData()), nil
	}
	return nil, fmt.Errorf("unsupported output value %T (ONNX type %s)", v, v.GetONNXType())
}

func scalarTensor[T ort.TensorData](d tensor.DType, v T) *tensor.Tensor {
	return &tensor.Tensor{DType: d, Shape: []int64{}, Data: asBytes([]T{v})}
}

// asBytes views s as its little-endian bytes (every supported platform is
// little-endian) without copying.
func asBytes[T ort.TensorData](s []T) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(zero)))
}

// alignedBytes returns n zero bytes aligned for any element type.
func alignedBytes(n int64) []byte {
	return asBytes(make([]uint64, (n+7)/8))[:n]
}

func narrow(s []float64) []float32 {
	out := make([]float32, len(s))
	for i, v := range s {
		out[i] = float32(v)
	}
	return out
}

// Float32View returns the elements of a Float32 tensor as []float32 sharing
// t.Data, so writes through either are seen by both. Data that is not 4-byte
// aligned is decoded into a new slice instead. It returns nil for other
// element types and for data whose length does not match the shape.
func Float32View(t *tensor.Tensor) []float32 {
	if t.DType != tensor.Float32 || int64(len(t.Data)) != 4*t.Elements() {
		return nil
	}
	if len(t.Data) == 0 {
		return []float32{}
	}
	if uintptr(unsafe.Pointer(&t.Data[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&t.Data[0])), len(t.Data)/4)
	}
	out := make([]float32, len(t.Data)/4)
	for i := range out {
		b := t.Data[4*i:]
		out[i] = math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
	}
	return out
}
