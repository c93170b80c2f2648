package trainlog_test

// The fixtures under testdata/ are training logs made by a simulator of
// PyTorch's GradScaler, driven by known overflow patterns. They are written
// by `go test ./trainlog -update` and checked against the simulator on
// every test run, so a reader can see how each was made and they never
// drift from this code.

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/ fixtures and golden files")

// gradScaler is torch.amp.GradScaler's update rule (_amp_update_scale_),
// in float32 like the scale tensor: on a step with Inf/NaN gradients the
// step is skipped, the scale multiplied by backoff and the tracker reset;
// after interval clean steps in a row the scale is multiplied by growth.
type gradScaler struct {
	scale           float32
	growth, backoff float32
	interval        int
	tracker         int
}

func newGradScaler(init float32, interval int) *gradScaler {
	return &gradScaler{scale: init, growth: 2, backoff: 0.5, interval: interval}
}

func (g *gradScaler) update(foundInf bool) {
	if foundInf {
		g.scale *= g.backoff
		g.tracker = 0
		return
	}
	g.tracker++
	if g.tracker == g.interval {
		if s := g.scale * g.growth; !math.IsInf(float64(s), 0) {
			g.scale = s
		}
		g.tracker = 0
	}
}

// scenario is one simulated run. A step's gradients overflow when the loss
// is NaN, when forceInf says so (Inf/NaN produced in backward whatever the
// scale) or when scale × gmax(t) exceeds fp16's max. The loss follows
// floor + (start-floor)·exp(-progress/tau) with noise, where progress grows
// by one per applied step, less when the scale is below underflowBelow
// (small gradients flush to zero), and not at all on skipped steps.
type scenario struct {
	name          string
	steps         int
	stepsPerEpoch int
	init          float32
	interval      int
	gmax          func(t int) float64
	forceInf      func(t int) bool
	// nanFrom is the first step whose forward pass overflows (the loss is
	// NaN from there on), -1 for none.
	nanFrom int
	// divergeFrom is where training starts diverging: the loss rises.
	divergeFrom    int
	underflowBelow float64
	// penalty multiplies the loss: fp16 rounding's small cost.
	penalty float64
	seed    uint64
	fp32    bool
}

// simulated is a scenario's log with the ground truth counted by the
// simulator itself.
type simulated struct {
	losses, scales []float64
	skipped        int
	firstNaN       int
	minScale       float64
}

func (sc scenario) run() simulated {
	g := newGradScaler(sc.init, sc.interval)
	rng := sc.seed*2654435761 + 1
	noise := func() float64 {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return float64(rng%10000)/10000 - 0.5
	}
	out := simulated{firstNaN: -1, minScale: math.Inf(1)}
	progress := 0.0
	for t := 0; t < sc.steps; t++ {
		lossNaN := sc.nanFrom >= 0 && t >= sc.nanFrom
		loss := 0.3 + 2.0*math.Exp(-progress/150)
		if sc.divergeFrom > 0 && t > sc.divergeFrom {
			loss += 0.01 * float64(t-sc.divergeFrom)
		}
		loss = loss*sc.penalty + 0.04*noise()*loss
		if lossNaN {
			loss = math.NaN()
			if out.firstNaN < 0 {
				out.firstNaN = t
			}
		}
		out.losses = append(out.losses, float64(float32(loss)))
		if sc.fp32 {
			progress++
			continue
		}
		overflow := lossNaN || (sc.forceInf != nil && sc.forceInf(t)) || float64(g.scale)*sc.gmax(t) > 65504
		if overflow {
			out.skipped++
		} else {
			eff := 1.0
			if sc.underflowBelow > 0 {
				eff = min(1, float64(g.scale)/sc.underflowBelow)
			}
			progress += eff
		}
		g.update(overflow)
		out.scales = append(out.scales, float64(g.scale))
		out.minScale = min(out.minScale, float64(g.scale))
	}
	return out
}

func constant(v float64) func(int) float64 { return func(int) float64 { return v } }

// hashed is a fixed pseudo-random subset of the steps from `from` on, with
// the given rate.
func hashed(from int, rate float64) func(int) bool {
	return func(t int) bool {
		if t < from {
			return false
		}
		h := uint32(t)*2246822519 + 374761393
		h ^= h >> 15
		h *= 3266489917
		h ^= h >> 13
		return float64(h%10000) < rate*10000
	}
}

var scenarios = []scenario{
	// Forward overflow at step 37 of a 50-step epoch; gmax 4 costs three
	// warm-up skips (65536, 32768 and 16384 all overflow), a normal start.
	{name: "early_nan", steps: 70, stepsPerEpoch: 50, init: 65536, interval: 2000, gmax: constant(4), nanFrom: 37, penalty: 1, seed: 1},
	// Training diverges from step 500: the largest gradient doubles every
	// 8 steps, the scale collapses, and the loss turns NaN at step 700.
	{name: "gradient_overflow_nan", steps: 720, stepsPerEpoch: 200, init: 65536, interval: 50, nanFrom: 700, divergeFrom: 500, penalty: 1, seed: 2,
		gmax: func(t int) float64 {
			if t < 500 {
				return 2
			}
			return 2 * math.Pow(2, float64(t-500)/8)
		}},
	// The scale sits at its equilibrium (2^14, probing 2^15 every 51 steps)
	// when the forward pass overflows at step 850.
	{name: "forward_overflow_nan", steps: 900, stepsPerEpoch: 200, init: 65536, interval: 50, gmax: constant(2), nanFrom: 850, penalty: 1, seed: 3},
	// From step 100, 3% of the steps produce Inf gradients whatever the
	// scale: 100 clean steps in a row become rare, so the scale comes down
	// and stays low, small gradients flush to zero below 2^8, and the loss
	// plateaus.
	{name: "plateau_underflow", steps: 1000, stepsPerEpoch: 200, init: 65536, interval: 100, gmax: constant(2), forceInf: hashed(100, 0.03),
		nanFrom: -1, underflowBelow: 256, penalty: 1, seed: 4},
	// A healthy fp16 run 1.5% above the baseline.
	{name: "fp16_noise", steps: 1000, stepsPerEpoch: 200, init: 65536, interval: 50, gmax: constant(2), nanFrom: -1, penalty: 1.015, seed: 5},
	// gmax 300: every scale above 2^7 overflows, so the first nine steps
	// are skipped on the way down from 2^16.
	{name: "wasted_warmup", steps: 800, stepsPerEpoch: 200, init: 65536, interval: 50, gmax: constant(300), nanFrom: -1, penalty: 1, seed: 6},
	{name: "healthy", steps: 800, stepsPerEpoch: 200, init: 65536, interval: 50, gmax: constant(2), nanFrom: -1, penalty: 1, seed: 7},
	// The fp32 baseline of plateau_underflow and fp16_noise: losses only.
	{name: "baseline_fp32", steps: 1000, stepsPerEpoch: 200, nanFrom: -1, penalty: 1, seed: 8, fp32: true},
}

// variants drop a series from a scenario's log.
var variants = []struct {
	scenario, suffix string
	noLosses         bool
	noScales         bool
}{
	{scenario: "gradient_overflow_nan", suffix: "_scales_only", noLosses: true},
	{scenario: "early_nan", suffix: "_scales_only", noLosses: true},
	{scenario: "forward_overflow_nan", suffix: "_losses_only", noScales: true},
	{scenario: "healthy", suffix: "_losses_only", noScales: true},
	{scenario: "healthy", suffix: "_scales_only", noLosses: true},
}

func scenarioByName(t testing.TB, name string) scenario {
	for _, s := range scenarios {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no scenario %q", name)
	return scenario{}
}

// pyFloat writes a float the way Python's json and csv modules do.
func pyFloat(v float64, csv bool) string {
	switch {
	case math.IsNaN(v):
		if csv {
			return "nan"
		}
		return "NaN"
	case math.IsInf(v, 1):
		if csv {
			return "inf"
		}
		return "Infinity"
	}
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		s = strconv.FormatFloat(v, 'f', 1, 64)
	}
	return s
}

// fixtureFiles renders every scenario and variant as JSON and CSV.
func fixtureFiles(t testing.TB) map[string][]byte {
	files := map[string][]byte{}
	emit := func(name string, sc scenario, sim simulated, losses, scales bool) {
		var j bytes.Buffer
		j.WriteString("{")
		if !sc.fp32 && scales {
			fmt.Fprintf(&j, `"grad_scaler": {"init_scale": %s, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": %d}, `,
				pyFloat(float64(sc.init), false), sc.interval)
		}
		fmt.Fprintf(&j, `"steps_per_epoch": %d`, sc.stepsPerEpoch)
		list := func(key string, xs []float64) {
			parts := make([]string, len(xs))
			for i, x := range xs {
				parts[i] = pyFloat(x, false)
			}
			fmt.Fprintf(&j, `, %q: [%s]`, key, strings.Join(parts, ", "))
		}
		if losses {
			list("losses", sim.losses)
		}
		if scales && sim.scales != nil {
			list("scales", sim.scales)
		}
		j.WriteString("}\n")
		files[name+".json"] = j.Bytes()

		var c bytes.Buffer
		cols := []string{"step", "epoch"}
		if losses {
			cols = append(cols, "loss")
		}
		if scales && sim.scales != nil {
			cols = append(cols, "scale")
		}
		c.WriteString(strings.Join(cols, ",") + "\n")
		for i := range sc.steps {
			row := []string{strconv.Itoa(i), strconv.Itoa(i / sc.stepsPerEpoch)}
			if losses {
				row = append(row, pyFloat(sim.losses[i], true))
			}
			if scales && sim.scales != nil {
				row = append(row, pyFloat(sim.scales[i], true))
			}
			c.WriteString(strings.Join(row, ",") + "\n")
		}
		files[name+".csv"] = c.Bytes()
	}
	for _, sc := range scenarios {
		emit(sc.name, sc, sc.run(), true, true)
	}
	for _, v := range variants {
		sc := scenarioByName(t, v.scenario)
		emit(v.scenario+v.suffix, sc, sc.run(), !v.noLosses, !v.noScales)
	}
	return files
}

// TestFixturesUpToDate regenerates the fixtures and compares them with
// testdata/; -update writes them.
func TestFixturesUpToDate(t *testing.T) {
	for name, want := range fixtureFiles(t) {
		golden(t, filepath.Join("testdata", name), want)
	}
}

// TestSimulatorMatchesPyTorch pins the update rule to PyTorch's documented
// behaviour: halve on overflow, double after interval clean steps, and an
// overflow resets the count.
func TestSimulatorMatchesPyTorch(t *testing.T) {
	g := newGradScaler(65536, 3)
	var got []float32
	for _, inf := range []bool{true, false, false, false, false, true, false, false, false} {
		g.update(inf)
		got = append(got, g.scale)
	}
	want := []float32{32768, 32768, 32768, 65536, 65536, 32768, 32768, 32768, 65536}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("scales %v, want %v", got, want)
	}
}
