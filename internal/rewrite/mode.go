package rewrite

import (
	"fmt"
	"slices"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// Modes of a forward pass, as PyTorch's module.train() and module.eval()
// set them: they change what BatchNormalization and Dropout compute.
const (
	// ModeEval is inference: BatchNormalization uses its running
	// statistics, Dropout passes its input through.
	ModeEval = "eval"
	// ModeTrain is a training step's forward: BatchNormalization uses the
	// batch's own mean and variance, Dropout zeroes elements with its
	// ratio and scales the rest by 1/(1-ratio).
	ModeTrain = "train"
)

// Modes lists the modes in the order a help text shows them.
func Modes() []string { return []string{ModeEval, ModeTrain} }

// ModeChanges says what SetMode did to a graph, by node index (the
// rewritten graph keeps every node at its index).
type ModeChanges struct {
	// Mode is the mode the graph now computes in.
	Mode string
	// BatchNorms are the BatchNormalization nodes that now compute in
	// Mode; Switched are those among them that computed in the other mode
	// as exported.
	BatchNorms, Switched []int
	// Dropouts are the Dropout nodes that now compute in Mode (opset 12
	// and newer, where Dropout has a training_mode input).
	Dropouts []int
	// Kept are nodes left in the other mode: a BatchNormalization whose
	// running-statistics outputs something reads, or a Dropout of opset
	// 7 to 11, which has no training mode.
	Kept []int
}

// SetMode returns a copy of m whose BatchNormalization and Dropout nodes
// compute as in mode (ModeEval or ModeTrain); m is not modified.
//
// Train mode sets BatchNormalization's training_mode (opset 14 and newer)
// with the three outputs ONNX Runtime insists on ("This number of op
// outputs should be 3 when Training_mode = True"), or gives it the five
// outputs that mean training at opsets 7 to 13. ONNX Runtime's CPU kernel
// then writes the updated running statistics into the buffers of its
// running-mean and running-variance inputs; when those are shared with
// other values (the exporter deduplicates an untrained BatchNorm's
// running_var = 1 with its weight, and ONNX Runtime's constant sharing
// merges equal initializers at optimization levels above "none"), the
// update overwrites the weight or bias before the kernel reads them. So
// every training BatchNormalization gets private copies of its running
// statistics, and sessions must run at optimization level "none".
// Dropout gets training_mode true and the given seed, so that every pass
// draws the same masks; its masks are ONNX Runtime's, not PyTorch's.
//
// Eval mode clears training_mode (drops the training outputs at opsets 7
// to 13) and the Dropout training_mode input.
func SetMode(m *onnx.ModelProto, mode string, seed int64, dir string) (*onnx.ModelProto, ModeChanges, error) {
	ch := ModeChanges{Mode: mode}
	if mode != ModeEval && mode != ModeTrain {
		return nil, ch, fmt.Errorf("mode %q: want eval or train", mode)
	}
	ix, err := onnx.NewIndex(m.Graph)
	if err != nil {
		return nil, ch, err
	}
	ix.BaseDir = dir
	out := onnx.ShallowCopy(m)
	g := out.Graph
	opset := defaultOpset(m)
	train := mode == ModeTrain
	read := func(v string) bool {
		if v == "" {
			return false
		}
		if len(ix.Consumers(v)) > 0 {
			return true
		}
		for _, o := range m.Graph.Output {
			if o.Name == v {
				return true
			}
		}
		return false
	}
	var trueInput string
	for i, n := range m.Graph.Node {
		if !onnx.IsDefaultDomain(n.Domain) {
			continue
		}
		switch n.OpType {
		case "BatchNormalization":
			if opset < 7 {
				ch.Kept = append(ch.Kept, i)
				continue
			}
			wasTrain := batchNormTraining(n, opset)
			if !train && slices.ContainsFunc(n.Output[min(1, len(n.Output)):], read) {
				// Something reads the updated statistics: the graph is a
				// training step, and inference has no such outputs.
				ch.Kept = append(ch.Kept, i)
				continue
			}
			c := onnx.CloneNode(n)
			if train {
				if err := trainBatchNorm(c, g, ix, opset); err != nil {
					return nil, ch, fmt.Errorf("node %s: %w", ix.NodeLabel(i), err)
				}
			} else {
				c.Output = c.Output[:1]
				if opset >= 14 {
					setIntAttr(c, "training_mode", 0)
				}
			}
			g.Node[i] = c
			ch.BatchNorms = append(ch.BatchNorms, i)
			if wasTrain != train {
				ch.Switched = append(ch.Switched, i)
			}
		case "Dropout":
			if opset < 12 {
				ch.Kept = append(ch.Kept, i)
				continue
			}
			c := onnx.CloneNode(n)
			if train {
				if trueInput == "" {
					trueInput = onnx.InternalName("dropout", "training")
					g.Initializer = append(g.Initializer, &onnx.TensorProto{Name: trueInput, DataType: int32(onnx.TensorProto_BOOL), RawData: []byte{1}})
				}
				for len(c.Input) < 3 {
					c.Input = append(c.Input, "")
				}
				c.Input[2] = trueInput
				setIntAttr(c, "seed", seed)
			} else if len(c.Input) > 2 {
				c.Input = c.Input[:2]
			}
			g.Node[i] = c
			ch.Dropouts = append(ch.Dropouts, i)
		}
	}
	return out, ch, nil
}

// batchNormTraining reports whether a BatchNormalization node computes with
// batch statistics as exported: training_mode=1 from opset 14, several
// outputs before.
func batchNormTraining(n *onnx.NodeProto, opset int64) bool {
	if opset >= 14 {
		return onnx.IntAttr(n, "training_mode", 0) != 0
	}
	return len(n.Output) > 1
}

// trainBatchNorm makes the clone c of a BatchNormalization compute with
// batch statistics, with private copies of its running statistics (see
// SetMode) added to g.
func trainBatchNorm(c *onnx.NodeProto, g *onnx.GraphProto, ix *onnx.Index, opset int64) error {
	outs := 3
	if opset < 14 {
		outs = 5
	} else {
		setIntAttr(c, "training_mode", 1)
	}
	for k := len(c.Output); k < outs; k++ {
		c.Output = append(c.Output, onnx.InternalName(c.Output[0], fmt.Sprintf("bn%d", k)))
	}
	for k := len(c.Output); k > outs; k-- {
		c.Output = c.Output[:outs]
	}
	for _, slot := range []int{3, 4} {
		if slot >= len(c.Input) || c.Input[slot] == "" {
			return fmt.Errorf("BatchNormalization without running statistics (input %d)", slot)
		}
		v, err := ConstantThroughIdentity(ix, c.Input[slot])
		if err != nil {
			// Computed at run time: not an initializer ONNX Runtime could
			// share, so the kernel's update stays in its own buffer.
			continue
		}
		name := onnx.InternalName(c.Output[0], fmt.Sprintf("stat%d", slot))
		v.Name = name
		g.Initializer = append(g.Initializer, onnx.EncodeTensor(v))
		c.Input[slot] = name
	}
	return nil
}

// ConstantThroughIdentity returns the contents of v, an initializer or
// Constant output, or one reached from them through Identity nodes (how
// exporters deduplicate equal initializers).
func ConstantThroughIdentity(ix *onnx.Index, v string) (*tensor.Tensor, error) {
	for range 64 {
		t, err := ix.ConstantValue(v)
		if err == nil {
			return t, nil
		}
		p := ix.Producer(v)
		if p < 0 {
			return nil, err
		}
		n := ix.Graph().Node[p]
		if n.OpType != "Identity" || !onnx.IsDefaultDomain(n.Domain) || len(n.Input) == 0 {
			return nil, err
		}
		v = n.Input[0]
	}
	return nil, fmt.Errorf("value %q: Identity chain too long", v)
}

// setIntAttr sets (or adds) an INT attribute on a cloned node.
func setIntAttr(n *onnx.NodeProto, name string, v int64) {
	for k, a := range n.Attribute {
		if a.Name == name {
			n.Attribute[k] = onnx.AttrInt(name, v)
			return
		}
	}
	n.Attribute = append(n.Attribute, onnx.AttrInt(name, v))
}

// defaultOpset returns the version of the default ONNX domain m imports.
func defaultOpset(m *onnx.ModelProto) int64 {
	for _, o := range m.OpsetImport {
		if onnx.IsDefaultDomain(o.Domain) {
			return o.Version
		}
	}
	return 0
}
