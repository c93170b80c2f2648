package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"fp16audit/internal/diagnose/evidence"
)

// toleranceFlag is --output-tolerance: the output tolerance of each
// reduced-precision format, as fp16=0.05,bf16=0.25 (a format left out
// keeps its value). A trailing % reads the number as a percentage.
type toleranceFlag struct{ t *evidence.Thresholds }

func (f toleranceFlag) String() string {
	if f.t == nil {
		return ""
	}
	return fmt.Sprintf("fp16=%g,bf16=%g", f.t.OutputTolFP16, f.t.OutputTolBF16)
}

func (f toleranceFlag) Type() string { return "FORMAT=ERR,..." }

func (f toleranceFlag) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return fmt.Errorf("%q: want FORMAT=ERR such as fp16=0.05,bf16=0.25", part)
		}
		pct := strings.HasSuffix(val, "%")
		x, err := strconv.ParseFloat(strings.TrimSuffix(val, "%"), 64)
		if pct {
			x /= 100
		}
		if err != nil || !(x > 0) || math.IsInf(x, 0) {
			return fmt.Errorf("%s=%s: want a relative error above 0, such as 0.05 or 5%%", name, val)
		}
		switch name {
		case "fp16":
			f.t.OutputTolFP16 = x
		case "bf16":
			f.t.OutputTolBF16 = x
		default:
			return fmt.Errorf("%q: want the format fp16 or bf16", name)
		}
	}
	return nil
}
