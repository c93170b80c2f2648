package lint

import (
	"fmt"

	"fp16audit/checks"
	"fp16audit/internal/precision"
)

var checkFlush = checks.Register(&checks.Check{ID: "FP4006", Title: "initializer flushes to zero in fp16", Severity: checks.SevWarning,
	Policies: []string{"autocast-fp16", "half"}, Doc: `Most nonzero elements of an initializer (weights, buffers, constants) have
|x| <= 2^-25 (about 2.98e-8) and become 0 when the policy holds them in
fp16: under half every parameter is fp16; under autocast-fp16 the weights
of MatMul, Gemm and Conv are cast to fp16. The layer then computes with
zeros instead of its weights, silently. Tiny weights usually come from a
bad initialization, weight decay run amok or a unit mismatch (a scale
folded into the weights); rescale the layer, keep it in fp32, or use
to_bf16(), which has fp32's range. The dynamic check FP3001 reports the
same loss for activations on real batches.`})

var flushAnalyzer = &Analyzer{Check: checkFlush, Run: runFlush}

func runFlush(f *Facts) ([]checks.Finding, error) {
	consts, err := f.Constants()
	if err != nil {
		return nil, err
	}
	epsValues := map[string]bool{}
	for _, s := range f.epsSites() {
		if s.value != "" {
			epsValues[s.value] = true // FP4005 reports these
		}
	}
	var out []checks.Finding
	for _, c := range consts {
		st := c.Stats
		if c.Node >= 0 || epsValues[c.Name] || st.NonZero == 0 || float64(st.Flush) <= flushFraction*float64(st.NonZero) {
			continue
		}
		first, n16 := -1, 0
		for _, i := range f.Model.Index.Consumers(c.Name) {
			if f.HeldAt(c.Name, i) == precision.FP16 {
				if first < 0 {
					first = i
				}
				n16++
			}
		}
		if first < 0 {
			continue
		}
		others := ""
		if n16 > 1 {
			others = fmt.Sprintf(" and %d other node(s)", n16-1)
		}
		out = append(out, f.finding(checkFlush, checks.SevWarning, first, c.Name, fmt.Sprintf(
			"initializer %q: %d of %d nonzero elements (%.0f%%) have |x| <= 2^-25 and become 0 in fp16; %s%s hold it in fp16 under %s",
			c.Name, st.Flush, st.NonZero, 100*float64(st.Flush)/float64(st.NonZero), f.where(first), others, f.Policy.Name)))
	}
	return out, nil
}
