package rewrite

import (
	"maps"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/precision"
)

// Emulate rewrites the upcast graph up so that ONNX Runtime's fp32 kernels
// see exactly the values autocast would hold in half precision: every value
// the assignment a holds in fp16 (bf16) passes through Cast(to=FLOAT16
// (BFLOAT16)) → Cast(to=FLOAT) right after it is produced, and every input
// an op casts to its lower precision passes through the same pair before
// that op. Arithmetic inside each op stays fp32, as on a GPU's fp16 kernels
// with fp32 accumulation; range and rounding are those of the 16-bit type.
//
// orig is the model's own graph (up has the same nodes at the same indices,
// with half casts promoted); a was computed on it, so explicit half casts
// of the model are restored here. Rounding a value keeps its name for the
// rounded result, so consumers, graph outputs and the statistics all see
// what the next op would see; the op's unrounded result gets an internal
// name.
//
// A clamp the model runs only on float16 values (HalfGuards) clamps in
// the passes that hold its value in fp16.
//
// A number torch.finfo(dtype) wrote (±float32's largest value in the fp32
// export) is written as the format's own limit where it lands in reduced
// precision, as PyTorch does at run time (see FinfoFill): each such reader
// reads an initializer of the limit of the precision it reads the number
// in, and a number the assignment holds in half is not rounded itself.
func Emulate(up *onnx.ModelProto, orig *onnx.GraphProto, a *precision.Assignment) *onnx.ModelProto {
	m, _ := EmulateHeld(up, orig, a)
	return m
}

// Held is one rounding Emulate makes: the Cast pair from Src through the
// 16-bit format to Dst, and the value of the model it holds.
type Held struct {
	// Src is the value as computed in fp32 and Dst the rounded one.
	Src, Dst string
	// Precision is the 16-bit format (FP16 or BF16).
	Precision precision.Precision
	// Value is the model's value held: Dst itself for a value the
	// assignment holds in reduced precision (its op's output renamed to
	// Src), the value copied for a copy.
	Value string
	// Slots are the node input slots that read a copy, nil for a value
	// held itself; Cast tells a copy an op casts to its lower precision
	// (read by the ops that cast it) from a source held in 16 bits (read
	// by every reader).
	Slots []Slot
	Cast  bool
}

// Slot is a node's input slot.
type Slot struct{ Node, Input int }

// EmulateHeld is Emulate, and also returns every rounding it made, in the
// order the graph appends them: what a backward reads where it
// differentiates at the values the forward held.
func EmulateHeld(up *onnx.ModelProto, orig *onnx.GraphProto, a *precision.Assignment) (*onnx.ModelProto, []Held) {
	out := onnx.ShallowCopy(up)
	g := out.Graph
	var extra []*onnx.NodeProto
	var held []Held
	heldAt := map[string]int{}

	round := func(src, dst, value string, p precision.Precision, cast bool) {
		mid := onnx.InternalName(dst, p.String())
		extra = append(extra,
			onnx.Node("Cast", mid, []string{src}, []string{mid}, onnx.AttrInt("to", int64(p.ElemType()))),
			onnx.Node("Cast", onnx.InternalName(dst, "back"), []string{mid}, []string{dst}, onnx.AttrInt("to", int64(elemFloat))))
		heldAt[dst] = len(held)
		held = append(held, Held{Src: src, Dst: dst, Precision: p, Value: value, Cast: cast})
	}
	// read records that slot j of node i reads the copy dst.
	read := func(dst string, i, j int) {
		h := &held[heldAt[dst]]
		h.Slots = append(h.Slots, Slot{i, j})
	}
	// Autocast leaves float64 tensors alone (only float32 is eligible for
	// its casts), and rounding one through a Cast back to FLOAT would change
	// its type; so values the graph holds in DOUBLE are never rounded. Nor
	// is a sequence or an optional (onnx.Kind): a container holds the
	// tensors put into it, rounded where they were made, and the tensors
	// taken out of it are rounded as they come out.
	unrounded := func(string) bool { return false }
	if ix, err := onnx.NewIndex(up.Graph); err == nil {
		unrounded = func(name string) bool { return ix.ElemType(name) == elemDouble || !ix.Tensor(name) }
	}

	// Numbers torch.finfo(dtype) wrote: a number the assignment holds in
	// half is not rounded (a reader in fp32 reads it as exported), and a
	// reader in fp16 or bf16 reads that format's limit.
	fillAt := map[[2]int]string{}
	filledSource, limits := map[string]bool{}, map[string]bool{}
	for _, f := range FinfoFills(up.Graph, a) {
		filledSource[f.Constant] = filledSource[f.Constant] || f.Source
		if !f.Reduced() {
			continue
		}
		name := onnx.InternalName(f.Constant, "finfo-"+f.Precision.String())
		if !limits[name] {
			limits[name] = true
			g.Initializer = append(g.Initializer, onnx.FloatTensor(name, nil, []float32{float32(f.Limit())}))
		}
		fillAt[[2]int{f.Node, f.Slot}] = name
	}

	// Sources held in half precision (graph inputs and parameters under
	// half, half initializers of the model) are rounded once; every use
	// reads the rounded copy.
	sourceCopy := map[string]string{}
	for _, vi := range orig.Input {
		if p := a.Value[vi.Name]; isHalf(p) && !unrounded(vi.Name) && !filledSource[vi.Name] {
			sourceCopy[vi.Name] = ""
		}
	}
	for _, t := range orig.Initializer {
		if p := a.Value[t.Name]; isHalf(p) && !unrounded(t.Name) && !filledSource[t.Name] {
			sourceCopy[t.Name] = ""
		}
	}
	for _, name := range slices.Sorted(maps.Keys(sourceCopy)) {
		r := onnx.InternalName(name, "src")
		sourceCopy[name] = r
		round(name, r, name, a.Value[name], false)
	}

	// Inputs cast to an op's lower precision: one rounded copy per value and
	// precision, shared by all ops that cast it.
	castCopy := map[string]string{}
	castOf := func(name, value string, p precision.Precision) string {
		key := name + "|" + p.String()
		if r, ok := castCopy[key]; ok {
			return r
		}
		r := onnx.InternalName(name, "to-"+p.String())
		castCopy[key] = r
		round(name, r, value, p, true)
		return r
	}

	// The model's float16-only clamps, which Upcast made Identities, clamp
	// again where this pass holds their value in fp16, as PyTorch's run
	// does.
	guards := HalfGuards(orig)
	for i, on := range orig.Node {
		n := g.Node[i]
		np := a.Node[i]
		if guards[i] && n.OpType == "Identity" {
			if a.Value[on.Input[0]] == precision.FP16 {
				restored := onnx.CloneNode(on)
				restored.Input[0] = n.Input[0]
				n = restored
				g.Node[i] = restored
			} else {
				// the Identity of the upcast graph, same names as the Clip's
				// value in and out
				on = n
			}
		}
		var changed *onnx.NodeProto
		edit := func() *onnx.NodeProto {
			if changed == nil {
				changed = onnx.CloneNode(n)
			}
			return changed
		}
		for j, in := range on.Input {
			if in == "" {
				continue
			}
			cur, copied := n.Input[j], false
			if r, ok := sourceCopy[in]; ok {
				cur, copied = r, true
			}
			if i < len(a.CastInputs) && j < len(a.CastInputs[i]) && a.CastInputs[i][j] &&
				isHalf(np) && a.Value[in] != np && !unrounded(in) {
				cur, copied = castOf(cur, in, np), true
			}
			if lim, ok := fillAt[[2]int{i, j}]; ok {
				edit().Input[j] = lim
			} else if copied {
				edit().Input[j] = cur
				read(cur, i, j)
			}
		}
		for k, o := range on.Output {
			if o == "" || !isHalf(a.Value[o]) || unrounded(o) || filledSource[o] {
				continue
			}
			raw := onnx.InternalName(o, "raw")
			edit().Output[k] = raw
			round(raw, o, o, a.Value[o], false)
		}
		if changed != nil {
			g.Node[i] = changed
		}
	}
	g.Node = append(g.Node, extra...)
	return out, held
}
