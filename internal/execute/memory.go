package execute

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/shapes"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// DefaultMemoryFraction is the share of available memory an audit plans
// for when --max-memory is not given: the rest is left to the model's
// weights inside ONNX Runtime, ONNX Runtime's own scratch memory and
// everything else on the machine.
const DefaultMemoryFraction = 0.5

// DefaultMemoryCap caps the default budget. Segments reuse their output
// buffers (the layers of a network repeat their shapes), while one
// unsegmented pass touches all of its outputs' memory for the first time,
// and fresh memory costs a page fault per 4 KiB: on the benchmark
// transformer, auditing in 1 GiB segments took about 0.6 of the
// unsegmented time (docs/performance.md).
const DefaultMemoryCap = 1 << 30

// ParseSize parses a byte size as --max-memory takes it: a number with an
// optional binary unit K, M, G or T (an optional trailing "B" or "iB" is
// accepted), e.g. 512M, 4G, 1.5G, 1073741824.
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("size %q: want a positive number of bytes with an optional unit K, M, G or T, e.g. 512M or 4G", s)
	}
	return int64(v * float64(mult)), nil
}

// FormatSize formats a byte count with a binary unit: 1.5 GiB, 320 MiB.
func FormatSize(n int64) string {
	const units = "KMGT"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	u := -1
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f %ciB", v, units[u])
	}
	return fmt.Sprintf("%.3g %ciB", v, units[u])
}

// memAvailable is availableMemory; tests replace it.
var memAvailable = availableMemory

// availableMemory returns the memory this process can still take without
// swapping or being killed: /proc/meminfo's MemAvailable, lowered to the
// room left under a cgroup (v2 or v1) memory limit when one is set. The
// string names the source; ok is false where neither can be read.
func availableMemory() (int64, string, bool) {
	avail, ok := memInfoAvailable()
	src := "MemAvailable in /proc/meminfo"
	if room, ok2 := cgroupRoom(); ok2 && (!ok || room < avail) {
		avail, src, ok = room, "the cgroup memory limit", true
	}
	return avail, src, ok
}

func memInfoAvailable() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// cgroupRoom returns limit − usage of the process's memory cgroup, with
// reclaimable page cache not counted as usage.
func cgroupRoom() (int64, bool) {
	readInt := func(path string) (int64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	statValue := func(path, key string) int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == key {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
		return 0
	}
	// cgroup v2 ("max" does not parse: no limit).
	if limit, ok := readInt("/sys/fs/cgroup/memory.max"); ok {
		if used, ok := readInt("/sys/fs/cgroup/memory.current"); ok {
			used -= statValue("/sys/fs/cgroup/memory.stat", "inactive_file")
			return max(limit-used, 0), true
		}
	}
	// cgroup v1: an unlimited group reports a huge limit.
	if limit, ok := readInt("/sys/fs/cgroup/memory/memory.limit_in_bytes"); ok && limit < 1<<60 {
		if used, ok := readInt("/sys/fs/cgroup/memory/memory.usage_in_bytes"); ok {
			used -= statValue("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")
			return max(limit-used, 0), true
		}
	}
	return 0, false
}

// mmapThreshold: buffers at least this large are mapped from the kernel
// and unmapped when dropped, so the process's memory shrinks as soon as a
// segment's values die instead of when the garbage collector gets to them.
const mmapThreshold = 256 << 10

// bufferPool hands out the float32 buffers ONNX Runtime writes the
// observed values into. Large buffers are anonymous memory maps; a put
// buffer is kept for reuse (a later batch or pass of the same shapes)
// while the free memory stays under keep, and unmapped otherwise.
type bufferPool struct {
	mu        sync.Mutex
	free      map[int][][]float32 // by length
	mapped    map[*float32]bool   // every live or free mapping
	freeBytes int64
	keep      int64
}

func newBufferPool(keep int64) *bufferPool {
	return &bufferPool{free: map[int][][]float32{}, mapped: map[*float32]bool{}, keep: keep}
}

// get returns a buffer of n float32s; its contents are undefined.
func (p *bufferPool) get(n int) []float32 {
	if 4*int64(n) < mmapThreshold {
		return make([]float32, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.free[n]; len(l) > 0 {
		b := l[len(l)-1]
		p.free[n] = l[:len(l)-1]
		p.freeBytes -= 4 * int64(n)
		return b
	}
	mem, err := syscall.Mmap(-1, 0, 4*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]float32, n)
	}
	b := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), n)
	p.mapped[&b[0]] = true
	return b
}

// put gives b back. Nothing may read or write b afterwards.
func (p *bufferPool) put(b []float32) {
	n := len(b)
	if 4*int64(n) < mmapThreshold {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.mapped[&b[0]] {
		return
	}
	if p.freeBytes+4*int64(n) <= p.keep {
		p.free[n] = append(p.free[n], b)
		p.freeBytes += 4 * int64(n)
		return
	}
	p.unmap(b)
}

// close unmaps every free buffer.
func (p *bufferPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, l := range p.free {
		for _, b := range l {
			p.unmap(b)
		}
		delete(p.free, n)
	}
	p.freeBytes = 0
}

func (p *bufferPool) unmap(b []float32) {
	delete(p.mapped, &b[0])
	_ = syscall.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*len(b)))
}

// MemoryPlan is the memory side of running a set of passes: the value shapes
// known before running, the segment plan, and what was measured to make it.
type MemoryPlan struct {
	plan   *segPlan
	shapes [][]map[string][]int64 // [pass][batch]
	passes []string
	// whole is the planned peak unsegmented; budget the memory planned for
	// (0: none), explicit whether --max-memory set it.
	whole, budget int64
	explicit      bool
	avail         int64
	availSrc      string
	probed        int   // values whose shape a probe run measured
	probeErr      error // why the probe run failed, if it did
}

// poolLimit is how much free buffer memory the pool keeps for reuse: one
// pass's observed values of the largest segment.
func (m *MemoryPlan) poolLimit() int64 { return m.plan.maxSet }

// Note says what was estimated and how the passes ran, for the report:
// "" when the passes ran whole on a complete estimate, which needs no
// comment.
func (m *MemoryPlan) Note() string {
	p := m.plan
	if p.segments() == 1 && p.unknown == 0 && m.probeErr == nil {
		return ""
	}
	var most int64
	for _, b := range p.perPass {
		most = max(most, b)
	}
	s := fmt.Sprintf("memory estimate: %s of observed values per batch in each of %d pass(es) (%s), %s at once with the weights (%s per session)",
		FormatSize(most), len(m.passes), strings.Join(m.passes, ", "), FormatSize(m.whole), FormatSize(p.weights))
	if p.unknown > 0 {
		s += fmt.Sprintf("; partial: %d value(s) of unknown size are not counted", p.unknown/max(1, len(m.passes)))
	}
	if m.probed > 0 {
		s += fmt.Sprintf("; the shapes of %d value(s) were measured by a probe run", m.probed)
	}
	if m.probeErr != nil {
		s += "; a probe run to measure the others failed"
	}
	if p.segments() > 1 {
		how := "--max-memory"
		if !m.explicit {
			how = fmt.Sprintf("the default: %s or %.0f%% of the %s available, whichever is less", FormatSize(DefaultMemoryCap), 100*DefaultMemoryFraction, FormatSize(m.avail))
		}
		s += fmt.Sprintf("; run in %d segments of at most %s each, under the budget of %s (%s)",
			p.segments(), FormatSize(p.peak), FormatSize(m.budget), how)
		if p.peak > m.budget {
			s += "; the largest segment is a single node above the budget"
		}
	}
	return s
}

// memoryPlan infers the value shapes of every pass for every batch (with a
// probe run for what inference misses), estimates the memory of running
// the passes unsegmented and cuts them into segments when that exceeds the
// budget: --max-memory, or DefaultMemoryFraction of the available memory.
// It refuses (a *BudgetError) when even the plan exceeds available memory.
func (e *Engine) memoryPlan(ctx context.Context, graphs []*passGraph, batches []batch.Batch) (*MemoryPlan, error) {
	m := &MemoryPlan{shapes: make([][]map[string][]int64, len(graphs))}
	for _, g := range graphs {
		m.passes = append(m.passes, g.name)
	}
	cache := make([]map[string]map[string][]int64, len(graphs))
	probes := map[string]map[string][]int64{}
	for pi := range graphs {
		cache[pi] = map[string]map[string][]int64{}
		m.shapes[pi] = make([]map[string][]int64, len(batches))
	}
	for bi, b := range batches {
		key := ""
		in := map[string][]int64{}
		for k, t := range b.Inputs {
			in[e.Inputs[k]] = t.Shape
			key += tensor.ShapeString(t.Shape)
		}
		for pi, pg := range graphs {
			if sh, ok := cache[pi][key]; ok {
				m.shapes[pi][bi] = sh
				continue
			}
			sh := shapes.Infer(pg.model.Graph, pg.idx, in, probes[key])
			if pi == 0 {
				if missing := pg.unsized(sh); len(missing) > 0 {
					got, err := e.probeShapes(ctx, pg, missing, b)
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					if err != nil {
						// The probe only sharpens the estimate: values it
						// cannot measure (sequences, maps, values ONNX
						// Runtime refuses to Shape) stay unknown, which
						// the note reports and the plan never cuts at.
						m.probeErr = err
						got = nil
					}
					for name, s := range got {
						sh[name] = s
					}
					probes[key] = got
					m.probed = max(m.probed, len(got))
				}
			}
			cache[pi][key] = sh
			m.shapes[pi][bi] = sh
		}
	}
	in := planInput{graphs: graphs, sizes: make([]map[string]int64, len(graphs)), rank0: map[string]bool{},
		nodes: len(e.Order), batches: len(batches), sets: min(len(graphs), 2) + 1}
	if overlap, _ := e.overlap(); overlap {
		in.sets = max(len(graphs), 2) + 1
	}
	for pi, pg := range graphs {
		sizes := map[string]int64{}
		for _, sh := range m.shapes[pi] {
			for name, s := range sh {
				size := int64(tensor.DType(pg.idx.ElemType(name)).Size())
				if size == 0 {
					size = 4
				}
				sizes[name] = max(sizes[name], tensor.NumElements(s)*size)
				if len(s) == 0 {
					in.rank0[name] = true
				}
			}
		}
		in.sizes[pi] = sizes
	}
	var ok bool
	m.avail, m.availSrc, ok = memAvailable()
	m.budget, m.explicit = e.MaxMemory, e.MaxMemory > 0
	if !m.explicit && ok {
		m.budget = min(int64(DefaultMemoryFraction*float64(m.avail)), DefaultMemoryCap)
	}
	whole := planSegments(in, 0)
	m.whole, m.plan = whole.peak, whole
	if m.budget > 0 && whole.peak > m.budget {
		m.plan = planSegments(in, m.budget)
	}
	if ok && m.plan.peak > m.avail {
		if m.plan.segments() == 1 {
			return nil, &BudgetError{Err: fmt.Errorf("the audit needs an estimated %s (%s of observed values per batch and pass, %d pass(es)) but %s is available (%s); "+
				"pass --max-memory %s to run it in segments", FormatSize(m.plan.peak), FormatSize(slices.Max(m.plan.perPass)), len(graphs),
				FormatSize(m.avail), m.availSrc, sizeFlag(int64(DefaultMemoryFraction*float64(m.avail))))}
		}
		return nil, &BudgetError{Err: fmt.Errorf("even cut into %d segments the audit needs an estimated %s but %s is available (%s); "+
			"audit fewer or smaller batches, or pass a smaller --max-memory", m.plan.segments(), FormatSize(m.plan.peak), FormatSize(m.avail), m.availSrc)}
	}
	return m, nil
}

// sizeFlag formats n as --max-memory takes it, rounded down to MiB.
func sizeFlag(n int64) string {
	if n >= 1<<30 && (n>>20)%1024 == 0 {
		return fmt.Sprintf("%dG", n>>30)
	}
	return fmt.Sprintf("%dM", max(n>>20, 1))
}

// unsized lists the values the plan needs a size for that shapes lacks:
// every observed value and every value a non-floating node makes.
func (pg *passGraph) unsized(shapes map[string][]int64) []string {
	var out []string
	seen := map[string]bool{}
	add := func(name string) {
		if _, ok := shapes[name]; !ok && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	for _, o := range pg.obs {
		add(o.Output)
	}
	for _, sp := range pg.spans() {
		add(sp.name)
	}
	return out
}

// probeShapes measures the shapes of names with one run of the pass graph
// in which only their Shape is an output, so the run holds no more than a
// plain inference does.
func (e *Engine) probeShapes(ctx context.Context, pg *passGraph, names []string, b batch.Batch) (map[string][]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := onnx.ShallowCopy(pg.model)
	g := m.Graph
	g.Output = nil
	outs := make([]string, len(names))
	for i, name := range names {
		outs[i] = onnx.InternalName(name, "shape")
		g.Node = append(g.Node, onnx.Node("Shape", outs[i], []string{name}, []string{outs[i]}))
		g.Output = append(g.Output, &onnx.ValueInfoProto{Name: outs[i], Type: &onnx.TypeProto{Value: &onnx.TypeProto_TensorType{
			TensorType: &onnx.TypeProto_Tensor{ElemType: int32(onnx.TensorProto_INT64)}}}})
	}
	data, err := onnx.Marshal(m)
	if err != nil {
		return nil, err
	}
	sess, err := onnxrt.NewSession(data, e.Inputs, outs, e.Session)
	if err != nil {
		return nil, fmt.Errorf("shape probe: %w", err)
	}
	defer sess.Close()
	res, err := sess.Run(b.Inputs)
	if err != nil {
		return nil, fmt.Errorf("shape probe, batch %s: %w", b.Source, err)
	}
	got := map[string][]int64{}
	for i, t := range res {
		if shape, err := t.Int64s(); err == nil {
			got[names[i]] = shape
		}
	}
	return got, nil
}
