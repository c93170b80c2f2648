package audit

import (
	"context"
	"errors"
	"fmt"
	"fp16audit/checks"
	"strings"
	"time"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// Version is fp16audit's version, printed by `fp16audit version` and stored
// in every report.
const Version = "0.2.0"

// Optimization is the ONNX Runtime graph optimization level of every pass.
const Optimization = "none"

// Thresholds are the verdict's tunable limits; DefaultThresholds documents
// the defaults, which the command line prints in --help.
type Thresholds struct {
	// HeadroomBits: a value held in fp16 whose fp32 headroom
	// log2(65504/max|x|) is below this gets FP2004.
	HeadroomBits float64
	// UnderflowFraction: a value held in fp16 losing more than this fraction
	// of its nonzero elements to zero gets FP3001.
	UnderflowFraction float64
	// ColumnScale: a tabular column with |mean| or std above this is "far
	// from standardized" (FP1004).
	ColumnScale float64
	// FixIterations bounds the keep-fp32 search: each iteration forces the
	// current origins to fp32 and re-runs.
	FixIterations int
}

// DefaultThresholds are the documented defaults.
var DefaultThresholds = Thresholds{HeadroomBits: 3, UnderflowFraction: 0.10, ColumnScale: 10, FixIterations: 8}

// Config is everything one audit needs. The command line fills it from flags;
// tests fill it directly.
type Config struct {
	ModelPath string
	// Inputs are the -i arguments: "name=path" or "path".
	Inputs []string
	// Shapes pins symbolic dimensions (--shape name=1x3x224x224).
	Shapes map[string][]int64
	// Seed and SyntheticBatches control generated inputs when Inputs is empty.
	Seed             int64
	SyntheticBatches int

	// Policy names the precision policy (precision.Policies); "" is autocast-fp16.
	Policy string
	// NoFixes skips the fix reruns (standardized inputs, keep-fp32).
	NoFixes    bool
	Thresholds Thresholds

	ORTLib  string
	Threads int
	Device  string
	// MaxMemory bounds the memory the passes plan for, in bytes
	// (--max-memory): above it, the model runs in segments. 0 plans for
	// DefaultMemoryCap or DefaultMemoryFraction of the available memory,
	// whichever is less.
	MaxMemory int64

	Progress Progress
}

// audit is the state of one run, shared by the stages of the diagnosis.
type audit struct {
	cfg     Config
	model   *onnx.Model
	up      *onnx.ModelProto // upcast: truly fp32
	upIdx   *onnx.Index
	order   []int // topological order of the model's nodes
	policy  *precision.Policy
	assign  *precision.Assignment
	mainRun string // name of the policy's emulated pass ("" under fp32)
	names   []string
	specs   []batch.InputSpec
	batches []batch.Batch
	sess    sessionSpec
	passes  map[string]*passResult
	// halfCast marks the model's own Cast-to-half nodes.
	halfCast map[int]bool
	inputs   []inputAnalysis
	report   *Report
}

// Run audits one model: it loads the model and its batches, runs the fp32
// reference and the emulated passes through ONNX Runtime, diagnoses the
// result and verifies the fixes. Errors are *UsageError (bad inputs or
// flags), *ModelError (the model cannot be loaded or run) or
// *runtime.LibraryNotFoundError.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	if cfg.Policy == "" {
		cfg.Policy = precision.DefaultPolicy
	}
	if cfg.Thresholds == (Thresholds{}) {
		cfg.Thresholds = DefaultThresholds
	}
	policy, err := precision.PolicyByName(cfg.Policy)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	m, err := onnx.Load(cfg.ModelPath)
	if err != nil {
		return nil, &ModelError{Path: cfg.ModelPath, Err: err}
	}
	a := &audit{cfg: cfg, model: m, policy: policy, passes: map[string]*passResult{}}
	a.specs = inputSpecs(m.Proto.Graph, m.Index)
	batches, notes, err := batch.Load(a.specs, batch.Options{
		Args: cfg.Inputs, Shapes: cfg.Shapes, Seed: cfg.Seed, SyntheticBatches: cfg.SyntheticBatches,
	})
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	a.batches = batches
	lib, err := onnxrt.FindLibrary(cfg.ORTLib)
	if err != nil {
		return nil, err
	}
	if err := onnxrt.Init(lib); err != nil {
		return nil, err
	}
	device := cfg.Device
	if device == "" {
		device = "cpu"
	}
	a.report = &Report{
		Schema:   SchemaVersion,
		Tool:     ToolInfo{Version: Version, ORTVersion: onnxrt.Version(), Device: device, ORTThreads: cfg.Threads},
		Model:    modelInfo(m),
		Policy:   policy.Name,
		Notes:    []string{},
		Origins:  []Origin{},
		Fixes:    []Fix{},
		Findings: []checks.Finding{},
	}
	for _, n := range notes {
		if n.Input != "" {
			a.report.Notes = append(a.report.Notes, fmt.Sprintf("input %q: %s", n.Input, n.Text))
		} else {
			a.report.Notes = append(a.report.Notes, n.Text)
		}
	}
	for _, b := range batches {
		rb := Batch{Source: b.Source, Synthetic: strings.HasPrefix(b.Source, "synthetic")}
		for _, t := range b.Inputs {
			rb.Shapes = append(rb.Shapes, t.Name+tensor.ShapeString(t.Shape))
		}
		a.report.Batches = append(a.report.Batches, rb)
	}
	// Every pass runs without graph optimizations: fusions (Conv+BatchNorm
	// folding, NCHWc kernels) change rounding and could merge the emulation's
	// rounding Casts away, and the instrumented graphs block most of them
	// anyway. So each node computes as written, as in PyTorch, and the fp32
	// pass returns bit for bit what a plain run at the same level returns.
	a.sess = sessionSpec{
		inputs: inputNames(a.specs),
		opts:   onnxrt.SessionOptions{Threads: cfg.Threads, Device: device, ExternalDataDir: m.Dir, Optimization: Optimization},
	}
	if err := a.prepare(); err != nil {
		return nil, &ModelError{Path: cfg.ModelPath, Err: err}
	}
	if cfg.MaxMemory < 0 {
		return nil, &UsageError{Err: fmt.Errorf("max memory: want a positive size, got %d", cfg.MaxMemory)}
	}
	if err := a.runMainPasses(ctx); err != nil {
		if IsUsage(err) {
			return nil, err
		}
		return nil, modelOrContext(cfg.ModelPath, err)
	}
	a.report.Inputs = a.inputReports()
	a.report.Nodes = a.nodeReports()
	a.report.Summary = summarize(a.report)
	if err := a.diagnose(ctx); err != nil {
		return nil, modelOrContext(cfg.ModelPath, err)
	}
	a.report.Tool.ElapsedSecs = time.Since(start).Seconds()
	return a.report, nil
}

func modelOrContext(path string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &ModelError{Path: path, Err: err}
}

// prepare builds the upcast graph, the topological order, the list of
// values to observe and the policy's precision assignment.
func (a *audit) prepare() error {
	g := a.model.Proto.Graph
	up, halfCasts, err := Upcast(a.model.Proto, a.model.Dir)
	if err != nil {
		return err
	}
	a.up = up
	if a.upIdx, err = onnx.NewIndex(up.Graph); err != nil {
		return err
	}
	a.halfCast = map[int]bool{}
	for _, i := range halfCasts {
		a.halfCast[i] = true
	}
	a.order = a.model.Index.Order()
	for _, ni := range a.order {
		// Constants are known without running, and their scalar outputs
		// could not come back through onnxruntime_go (rank-0 outputs).
		if n := g.Node[ni]; n.OpType == "Constant" && (n.Domain == "" || n.Domain == "ai.onnx") {
			continue
		}
		for _, o := range g.Node[ni].Output {
			if t := a.upIdx.ElemType(o); o != "" && (isFloat(t) || t == 0) {
				a.names = append(a.names, o)
			}
		}
	}
	a.assign = precision.Assign(a.policy, g, a.order, a.model.Index.ElemType)
	if a.policy.Lower != precision.FP32 {
		a.mainRun = a.policy.Lower.String()
	}
	if len(a.assign.Unknown) > 0 {
		var names []string
		for _, i := range a.assign.Unknown {
			names = append(names, a.nodeName(i)+" ("+opName(g.Node[i])+")")
		}
		a.report.Notes = append(a.report.Notes, fmt.Sprintf("%d node(s) of unknown precision were emulated as following their inputs: %s",
			len(names), strings.Join(limitList(names, 10), ", ")))
	}
	return nil
}

func opName(n *onnx.NodeProto) string {
	if n.Domain != "" && n.Domain != "ai.onnx" {
		return n.Domain + "::" + n.OpType
	}
	return n.OpType
}

func limitList(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("and %d more", len(s)-n))
}

// runMainPasses runs the fp32 reference, the policy's emulated pass and,
// when that is fp16, the bf16 pass (the to_bf16() fix), batch by batch and,
// when the memory budget asks for it, segment by segment.
func (a *audit) runMainPasses(ctx context.Context) error {
	passes := []passModel{{name: "fp32", model: a.up}}
	if a.mainRun == "bf16" && !castsToBF16(a.up) {
		return fmt.Errorf("policy %s: the model imports ONNX opset %d, and emulating bf16 needs Cast to bfloat16 (opset 13); use an fp16 policy or re-export with opset_version >= 13", a.policy.Name, defaultOpset(a.up))
	}
	if a.mainRun != "" {
		passes = append(passes, passModel{name: a.mainRun, model: Emulate(a.up, a.model.Proto.Graph, a.assign), ref: "fp32"})
		if a.mainRun == "fp16" && !castsToBF16(a.up) {
			a.report.Notes = append(a.report.Notes, fmt.Sprintf("no bf16 pass: the model imports ONNX opset %d, and Cast to bfloat16 needs opset 13", defaultOpset(a.up)))
		} else if a.mainRun == "fp16" {
			bp, _ := precision.PolicyByName("autocast-bf16")
			ba := precision.Assign(bp, a.model.Proto.Graph, a.order, a.model.Index.ElemType)
			passes = append(passes, passModel{name: "bf16", model: Emulate(a.up, a.model.Proto.Graph, ba), ref: "fp32"})
		}
	}
	runs, err := a.execute(ctx, passes, a.batches, true)
	if err != nil {
		return err
	}
	for _, r := range runs {
		a.report.Passes = append(a.report.Passes, r.name)
		a.passes[r.name] = r.res
	}
	return nil
}

// defaultOpset returns the version of the default ONNX domain m imports.
func defaultOpset(m *onnx.ModelProto) int64 {
	for _, o := range m.OpsetImport {
		if o.Domain == "" || o.Domain == "ai.onnx" {
			return o.Version
		}
	}
	return 0
}

// castsToBF16 reports whether m's opset has Cast to bfloat16 (opset 13).
func castsToBF16(m *onnx.ModelProto) bool { return defaultOpset(m) >= 13 }

// dropUntyped removes the values without a known element type from the
// observed list; it reports whether there were any.
func (a *audit) dropUntyped() bool {
	kept := a.names[:0:0]
	for _, n := range a.names {
		if a.upIdx.ElemType(n) != 0 {
			kept = append(kept, n)
		}
	}
	if len(kept) == len(a.names) {
		return false
	}
	a.report.Notes = append(a.report.Notes, fmt.Sprintf("%d value(s) of undeclared type are not observed (run ONNX shape inference on the model to include them)", len(a.names)-len(kept)))
	a.names = kept
	return true
}

// rerun runs one extra emulated pass over batches (a fix being verified)
// and returns its results.
func (a *audit) rerun(ctx context.Context, name string, model *onnx.ModelProto, batches []batch.Batch) (*passResult, error) {
	runs, err := a.execute(ctx, []passModel{{name: name, model: model}}, batches, false)
	if err != nil {
		return nil, err
	}
	return runs[0].res, nil
}

// sessionSpec holds what every pass's session shares.
type sessionSpec struct {
	inputs []string
	opts   onnxrt.SessionOptions
}

func inputNames(specs []batch.InputSpec) []string {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return names
}

// inputSpecs lists the graph inputs that are not initializers.
func inputSpecs(g *onnx.GraphProto, idx *onnx.Index) []batch.InputSpec {
	var specs []batch.InputSpec
	for _, vi := range g.Input {
		if idx.IsInitializer(vi.Name) {
			continue
		}
		tt := vi.GetType().GetTensorType()
		spec := batch.InputSpec{Name: vi.Name, DType: tensor.DType(tt.GetElemType())}
		for _, d := range tt.GetShape().GetDim() {
			if p := d.GetDimParam(); p != "" || d.GetValue() == nil {
				spec.Dims = append(spec.Dims, -1)
				spec.DimNames = append(spec.DimNames, p)
			} else {
				spec.Dims = append(spec.Dims, d.GetDimValue())
				spec.DimNames = append(spec.DimNames, "")
			}
		}
		specs = append(specs, spec)
	}
	return specs
}

func valueInfoString(vi *onnx.ValueInfoProto) IOInfo {
	tt := vi.GetType().GetTensorType()
	if tt == nil {
		return IOInfo{Name: vi.Name, DType: "non-tensor", Shape: "?"}
	}
	dims := make([]string, 0, len(tt.GetShape().GetDim()))
	for _, d := range tt.GetShape().GetDim() {
		switch {
		case d.GetDimParam() != "":
			dims = append(dims, d.GetDimParam())
		case d.GetValue() == nil:
			dims = append(dims, "?")
		default:
			dims = append(dims, fmt.Sprint(d.GetDimValue()))
		}
	}
	return IOInfo{Name: vi.Name, DType: tensor.DType(tt.GetElemType()).String(), Shape: "[" + strings.Join(dims, ",") + "]"}
}

func modelInfo(m *onnx.Model) ModelInfo {
	p := m.Proto
	info := ModelInfo{
		Path: m.Path, Producer: p.ProducerName, ProducerVersion: p.ProducerVersion,
		IRVersion: p.IrVersion, Opsets: map[string]int64{}, NodeCount: len(p.Graph.Node),
	}
	for _, o := range p.OpsetImport {
		d := o.Domain
		if d == "" {
			d = "ai.onnx"
		}
		info.Opsets[d] = o.Version
	}
	for _, vi := range m.Index.GraphInputs() {
		info.Inputs = append(info.Inputs, valueInfoString(vi))
	}
	for _, vi := range p.Graph.Output {
		info.Outputs = append(info.Outputs, valueInfoString(vi))
	}
	return info
}

// nodeReports lists every node of the model in topological order with the
// statistics of its float outputs in each pass and, for emulated passes,
// their comparison with fp32.
func (a *audit) nodeReports() []NodeReport {
	g := a.model.Proto.Graph
	nodes := make([]NodeReport, 0, len(a.order))
	for _, ni := range a.order {
		n := g.Node[ni]
		nr := NodeReport{Index: ni, Name: n.Name, OpType: n.OpType, Domain: n.Domain,
			Module: precision.ModulePath(n), Precision: a.assign.Node[ni].String(), Outputs: []ValueReport{}}
		for _, o := range n.Output {
			var vr *ValueReport
			for _, p := range a.report.Passes {
				res := a.passes[p]
				st, ok := res.Stats[o]
				if !ok {
					continue
				}
				if vr == nil {
					vr = &ValueReport{Name: o, DType: tensor.DType(a.upIdx.ElemType(o)).String(),
						Shape: tensor.ShapeString(res.Shapes[o]), Stats: map[string]StatsReport{}}
				}
				sr := statsReport(*st)
				if res.Diffs != nil {
					if d := res.Diffs[o]; d != nil {
						if re := d.RelErr(); !isInfOrNaN(re) {
							sr.RelErr = &re
						}
						sr.NewNonFinite = d.NewNonFinite
						sr.FlushedFraction = d.FlushedFraction()
					}
				}
				if sr.NonFinite() > 0 {
					nr.Flagged = true
				}
				vr.Stats[p] = sr
			}
			if vr != nil {
				nr.Outputs = append(nr.Outputs, *vr)
			}
		}
		nodes = append(nodes, nr)
	}
	return nodes
}

func summarize(r *Report) Summary {
	var s Summary
	for _, n := range r.Nodes {
		for _, o := range n.Outputs {
			st, ok := o.Stats["fp32"]
			if !ok {
				continue
			}
			s.FloatValues++
			if st.NonFinite() > 0 {
				s.NonFiniteFP32++
			}
			if h := st.HeadroomBits; h != nil && (s.MinHeadroomBits == nil || *h < *s.MinHeadroomBits) {
				v := *h
				s.MinHeadroomBits = &v
				s.MinHeadroomValue = o.Name
			}
		}
	}
	return s
}

// IsUsage reports whether err is a usage or input error (exit code 2).
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
