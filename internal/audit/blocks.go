package audit

import (
	"math"
	"strings"

	"fp16audit/internal/onnx"
	"fp16audit/report"
)

// blockOf maps module paths to their block: the element of a repeated
// container when the path runs through one (model.layers.3.mlp →
// model.layers.3), else the path cut to the depth of the shallowest
// container (model.embed_tokens, lm_head), so the modules around the
// repeated blocks stand beside them.
type blockOf struct {
	// containers are the module paths whose children are numbered with at
	// least two numbers (model.layers, encoder.layer, layer1).
	containers map[string]bool
	depth      int
}

func newBlockOf(modules []string) *blockOf {
	indices := map[string]map[string]bool{}
	for _, m := range modules {
		segs := strings.Split(m, ".")
		for k := 1; k < len(segs); k++ {
			if !numeric(segs[k]) {
				continue
			}
			prefix := strings.Join(segs[:k], ".")
			if indices[prefix] == nil {
				indices[prefix] = map[string]bool{}
			}
			indices[prefix][segs[k]] = true
		}
	}
	b := &blockOf{containers: map[string]bool{}, depth: 1}
	shallowest := 0
	for prefix, idx := range indices {
		if len(idx) < 2 {
			continue
		}
		b.containers[prefix] = true
		if d := strings.Count(prefix, ".") + 1; shallowest == 0 || d < shallowest {
			shallowest = d
		}
	}
	if shallowest > 0 {
		b.depth = shallowest
	}
	return b
}

// of returns the block of module m and whether it is an element of a
// repeated container.
func (b *blockOf) of(m string) (string, bool) {
	if m == "" {
		return "", false
	}
	segs := strings.Split(m, ".")
	for k := 1; k < len(segs); k++ {
		if numeric(segs[k]) && b.containers[strings.Join(segs[:k], ".")] {
			return strings.Join(segs[:k+1], "."), true
		}
	}
	return strings.Join(segs[:min(b.depth, len(segs))], "."), false
}

func numeric(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// blockReports rolls the node reports up by block, in the order the blocks
// first appear, and sets each node's Block. main is the policy's emulated
// pass ("" under fp32); origins are the report's, the ones that reach an
// output; masked tells the nodes whose values carry a mask rather than
// computed values (evidence.Facts.Masked), which set no headroom.
func blockReports(g *onnx.GraphProto, ix *onnx.Index, nodes []report.NodeReport, main string, origins []report.Origin, masked func(int) bool) []report.Block {
	modules := make([]string, len(nodes))
	for i, n := range nodes {
		modules[i] = n.Module
	}
	bo := newBlockOf(modules)
	at := map[string]int{} // block module → position in blocks
	var blocks []report.Block
	nodeBlock := map[int]string{} // node index in g → block module
	for i := range nodes {
		name, repeated := bo.of(nodes[i].Module)
		nodes[i].Block = name
		nodeBlock[nodes[i].Index] = name
		if _, ok := at[name]; !ok {
			at[name] = len(blocks)
			blocks = append(blocks, report.Block{Module: name, Repeated: repeated})
		}
	}
	// The NaN/Inf that count are those reaching the outputs: the report's
	// origins (in the policy's pass; in fp32 for a poisoned batch or a
	// model broken in fp32) and the nodes they reached. A mask constant
	// that is -Inf in fp16 and that softmax absorbs neither is a block's
	// first overflow nor sets its headroom.
	isOrigin := map[int]bool{}
	reached := map[string]bool{}
	for _, o := range origins {
		if o.Index >= 0 {
			isOrigin[o.Index] = true
			reached[o.Node] = true
		}
		for _, a := range o.Affected {
			reached[a] = true
		}
	}
	graphOutput := map[string]bool{}
	for _, o := range g.GetOutput() {
		graphOutput[o.GetName()] = true
	}
	// leaves reports whether value v of block b is read outside it.
	leaves := func(v, b string) bool {
		if graphOutput[v] {
			return true
		}
		for _, c := range ix.Consumers(v) {
			if nodeBlock[c] != b {
				return true
			}
		}
		return false
	}
	for i := range nodes {
		n := &nodes[i]
		b := &blocks[at[n.Block]]
		b.Nodes++
		if n.Flagged {
			b.Flagged++
		}
		if n.Constant {
			continue
		}
		absorbed := main != "" && n.NonFiniteIn(main) && !reached[n.Name]
		if b.FirstOverflow == "" && main != "" && n.NonFiniteIn(main) && !absorbed {
			b.FirstOverflow, b.Origin = n.Name, isOrigin[n.Index]
		}
		for j := range n.Outputs {
			o := &n.Outputs[j]
			if (n.Precision == "fp16" || n.Precision == "bf16") && !absorbed && !masked(n.Index) && o.Stats[report.PassFP32].MaxAbs != nil {
				if x := *o.Stats[report.PassFP32].MaxAbs; x > 0 && (b.MaxAbs == nil || x > *b.MaxAbs) {
					b.MaxAbs, b.MaxAbsValue = &x, o.Name
				}
			}
			if len(o.Stats) > 0 && leaves(o.Name, n.Block) {
				v := *o
				b.Output = &v
			}
		}
	}
	for i := range blocks {
		if b := &blocks[i]; b.MaxAbs != nil {
			h := math.Log2(65504 / *b.MaxAbs)
			b.HeadroomBits = &h
		}
	}
	return blocks
}
