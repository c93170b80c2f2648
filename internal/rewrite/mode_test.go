package rewrite

import (
	"fp16audit/internal/testutil/ortinit"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/tensor"
)

// batchNormRef normalizes x [N, C, ...] per channel with the batch's mean
// and biased variance, as PyTorch's training-mode batch_norm does (weight
// 1, bias 0).
func batchNormRef(x []float32, shape []int64, eps float64) []float64 {
	n, c := int(shape[0]), int(shape[1])
	sp := len(x) / n / c
	y := make([]float64, len(x))
	for ch := range c {
		var sum, sq float64
		for i := range n {
			for k := range sp {
				sum += float64(x[(i*c+ch)*sp+k])
			}
		}
		mean := sum / float64(n*sp)
		for i := range n {
			for k := range sp {
				d := float64(x[(i*c+ch)*sp+k]) - mean
				sq += d * d
			}
		}
		inv := 1 / math.Sqrt(sq/float64(n*sp)+eps)
		for i := range n {
			for k := range sp {
				j := (i*c+ch)*sp + k
				y[j] = (float64(x[j]) - mean) * inv
			}
		}
	}
	return y
}

// TestTrainModeBatchNorm switches the BatchNorm1d layers of an eval-mode
// export (running_var deduplicated into an Identity of the weight, both 1,
// and running_mean into one of the bias) to batch statistics, and checks
// each against the batch-statistics formula. Without private copies of the
// running statistics ONNX Runtime's in-place update of running_var would
// overwrite the weight before the kernel reads it.
func TestTrainModeBatchNorm(t *testing.T) {
	ortinit.Init(t)
	dir := "../../fixtures/torch/cases/tabular_fastai_raw"
	m, err := onnx.Load(filepath.Join(dir, "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	tm, ch, err := SetMode(m.Proto, ModeTrain, 1, m.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.BatchNorms) != 2 || !slices.Equal(ch.BatchNorms, ch.Switched) || len(ch.Kept) != 0 {
		t.Fatalf("changes %+v: want both BatchNormalization nodes switched", ch)
	}
	var ins, outs []string
	for _, i := range ch.BatchNorms {
		n := tm.Graph.Node[i]
		if onnx.IntAttr(n, "training_mode", 0) != 1 || len(n.Output) != 3 {
			t.Fatalf("node %s: training_mode %d, %d outputs", n.Name, onnx.IntAttr(n, "training_mode", 0), len(n.Output))
		}
		if m.Index.Producer(n.Input[3]) >= 0 || n.Input[3] == m.Proto.Graph.Node[i].Input[3] {
			t.Errorf("node %s reads running mean %q: want a private initializer", n.Name, n.Input[3])
		}
		ins, outs = append(ins, n.Input[0]), append(outs, n.Output[0])
	}
	if m.Proto.Graph.Node[ch.BatchNorms[0]].Output[0] != outs[0] || len(m.Proto.Graph.Node[ch.BatchNorms[0]].Output) != 1 {
		t.Fatal("SetMode modified the loaded model")
	}
	ts, err := batch.ReadNPZ(filepath.Join(dir, "batches", "batch.npz"))
	if err != nil {
		t.Fatal(err)
	}
	feeds := map[string]*tensor.Tensor{}
	for _, x := range ts {
		feeds[x.Name] = x
	}
	g := onnx.ShallowCopy(tm)
	for _, v := range append(slices.Clone(ins), outs...) {
		g.Graph.Output = append(g.Graph.Output, onnx.TensorValueInfo(v, onnx.TensorProto_FLOAT, -1, -1))
	}
	for run := range 2 { // the second run sees the statistics the first one updated
		res := runModel(t, g, onnxrt.SessionOptions{Threads: 1, Optimization: optimization},
			[]*tensor.Tensor{feeds["cats"], feeds["conts"]}, []string{"cats", "conts"}, append(slices.Clone(ins), outs...))
		for k := range ins {
			x, y := onnxrt.Float32View(res[k]), onnxrt.Float32View(res[len(ins)+k])
			want := batchNormRef(x, res[k].Shape, 1e-5)
			for j := range want {
				if math.Abs(float64(y[j])-want[j]) > 1e-4*(1+math.Abs(want[j])) {
					t.Fatalf("run %d, %s element %d: %g, batch statistics give %g", run, outs[k], j, y[j], want[j])
				}
			}
		}
	}

	// Back to eval mode: one output, training_mode 0, the exported
	// running statistics.
	em, ch, err := SetMode(tm, ModeEval, 0, m.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ch.Switched, ch.BatchNorms) || len(ch.BatchNorms) != 2 {
		t.Fatalf("eval changes %+v", ch)
	}
	for _, i := range ch.BatchNorms {
		if n := em.Graph.Node[i]; len(n.Output) != 1 || onnx.IntAttr(n, "training_mode", 1) != 0 {
			t.Errorf("node %s in eval mode: outputs %v, training_mode %d", n.Name, n.Output, onnx.IntAttr(n, "training_mode", 1))
		}
	}
}

// TestModeDropout: train mode feeds Dropout training_mode true and the
// seed, eval mode removes the input; opset 11 Dropout has no training mode
// and is kept.
func TestModeDropout(t *testing.T) {
	g := &onnx.GraphProto{
		Node:        []*onnx.NodeProto{onnx.Node("Dropout", "d", []string{"x", "r", "tm"}, []string{"y", "mask"})},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("r", []int64{}, []float32{0.5}), {Name: "tm", DataType: int32(onnx.TensorProto_BOOL), RawData: []byte{0}}},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 64, 64)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 64, 64)},
	}
	tm, ch, err := SetMode(onnx.NewModel(g, 13), ModeTrain, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	n := tm.Graph.Node[0]
	if !slices.Equal(ch.Dropouts, []int{0}) || onnx.IntAttr(n, "seed", 0) != 7 || n.Input[2] == "tm" {
		t.Fatalf("train mode: changes %+v, node %v seed %d", ch, n.Input, onnx.IntAttr(n, "seed", 0))
	}
	ortinit.Init(t)
	x := make([]float32, 64*64)
	for i := range x {
		x[i] = 1
	}
	y := onnxrt.Float32View(runModel(t, tm, onnxrt.SessionOptions{Threads: 1, Optimization: optimization},
		[]*tensor.Tensor{tensor.FromFloat32s("x", []int64{64, 64}, x)}, []string{"x"}, []string{"y"})[0])
	zeros := 0
	for _, v := range y {
		switch v {
		case 0:
			zeros++
		case 2:
		default:
			t.Fatalf("training Dropout(0.5) of ones gave %g: want 0 or 2", v)
		}
	}
	if zeros < 1500 || zeros > 2600 {
		t.Errorf("%d of 4096 dropped at ratio 0.5", zeros)
	}
	em, _, err := SetMode(tm, ModeEval, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(em.Graph.Node[0].Input) != 2 {
		t.Errorf("eval mode Dropout inputs %v: want the training_mode input gone", em.Graph.Node[0].Input)
	}
	_, ch, err = SetMode(onnx.NewModel(g, 11), ModeTrain, 7, "")
	if err != nil || !slices.Equal(ch.Kept, []int{0}) || len(ch.Dropouts) != 0 {
		t.Errorf("opset 11: changes %+v, err %v: want the Dropout kept", ch, err)
	}
}
