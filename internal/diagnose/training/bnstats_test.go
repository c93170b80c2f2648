package training

import (
	"math"
	"testing"

	"fp16audit/internal/observe"
	"fp16audit/internal/onnx"
)

// bnFacts is x → BatchNormalization (8 channels, running statistics mean
// and variance, ONNX momentum m) in eval mode, with the fp32 pass's
// statistics of x giving its RMS.
func bnFacts(t *testing.T, mean, variance []float32, m float32, inputRMS float64) *Facts {
	t.Helper()
	c := int64(len(mean))
	ones := make([]float32, c)
	for i := range ones {
		ones[i] = 1
	}
	g := &onnx.GraphProto{Name: "bn",
		Node: []*onnx.NodeProto{onnx.Node("BatchNormalization", "/bn1/BatchNormalization", []string{"x", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"},
			[]string{"y"}, onnx.AttrFloat("momentum", m))},
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("bn1.weight", []int64{c}, ones), onnx.FloatTensor("bn1.bias", []int64{c}, make([]float32, c)),
			onnx.FloatTensor("bn1.running_mean", []int64{c}, mean), onnx.FloatTensor("bn1.running_var", []int64{c}, variance)},
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, int64(4), c, int64(2), int64(2))},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, int64(4), c, int64(2), int64(2))},
	}
	ix, err := onnx.NewIndex(g)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(4 * c * 4)
	st := observe.NewStats()
	st.Finite, st.Count, st.SumSq = n, n, inputRMS*inputRMS*float64(n)
	return &Facts{Model: &onnx.Model{Proto: &onnx.ModelProto{Graph: g}, Index: ix}, Mode: "eval",
		FP32: &observe.PassResult{Name: "fp32", Stats: map[string]*observe.Stats{"x": &st}}}
}

// TestUntrainedBNStats: FP6001 fires on statistics at the defaults and
// on one momentum update from them by a batch like the audited one, and
// not on trained statistics: variances all above the momentum (a stem
// BatchNorm on pixel-scale data) whose batch would have had another
// scale, or any statistics under PyTorch's momentum 0 (ONNX 1: no update
// moves the defaults, a frozen pretrained BatchNorm).
func TestUntrainedBNStats(t *testing.T) {
	const c = 8
	batchVar, batchMean := make([]float32, c), make([]float32, c)
	for i := range c {
		batchVar[i], batchMean[i] = float32(40+10*i), float32(5-i)
	}
	// one update of PyTorch's momentum 0.1 (ONNX 0.9) from the defaults
	oneMean, oneVar := make([]float32, c), make([]float32, c)
	var ms float64
	for i := range c {
		oneMean[i], oneVar[i] = 0.1*batchMean[i], 0.9+0.1*batchVar[i]
		ms += float64(batchVar[i]) + float64(batchMean[i])*float64(batchMean[i])
	}
	batchRMS := math.Sqrt(ms / c)
	trainedVar, trainedMean := make([]float32, c), make([]float32, c)
	for i := range c {
		trainedVar[i], trainedMean[i] = float32(1.5+0.5*float64(i)), float32(0.3*float64(i)-1)
	}
	zero, one := make([]float32, c), make([]float32, c)
	for i := range one {
		one[i] = 1
	}
	for _, tc := range []struct {
		name       string
		mean, vari []float32
		momentum   float32
		inputRMS   float64
		want       string
	}{
		{"defaults", zero, one, 0.9, batchRMS, "defaults"},
		{"one update by this kind of batch", oneMean, oneVar, 0.9, batchRMS, "one-step"},
		{"trained, variances >= 1, the batch they were trained on", trainedMean, trainedVar, 0.9, 2.0, "trained"},
		{"trained, variances >= 1, raw data 100x their scale", trainedMean, trainedVar, 0.9, 200, "trained"},
		{"PyTorch momentum 0 (ONNX 1): pretrained, frozen", trainedMean, trainedVar, 1.0, 200, "trained"},
		{"PyTorch momentum 0, the one-step numbers", oneMean, oneVar, 1.0, batchRMS, "trained"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := bnFacts(t, tc.mean, tc.vari, tc.momentum, tc.inputRMS)
			bns := f.batchNorms()
			if len(bns) != 1 || bns[0].RunningStats != tc.want {
				t.Fatalf("running statistics %+v, want %s", bns, tc.want)
			}
			fds, err := runBNStats(f)
			if err != nil {
				t.Fatal(err)
			}
			// untrained statistics normalize the batch far from how its
			// own statistics would: FP6001
			if flagged := len(fds) > 0; flagged != (tc.want != "trained") {
				t.Errorf("FP6001 %v on %s statistics", fds, tc.want)
			}
		})
	}
}
