package capture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

// maxLogLine bounds one line of the training log (a telemetry line of a
// model with thousands of modules stays far below it).
const maxLogLine = 64 << 20

// Log is what the replay's timeline reads of the capture's training log
// (fp16audit.trainlog, written by the same recorder): the step lines, the
// telemetry lines and the capture lines.
type Log struct {
	// GrowthInterval is the GradScaler's, from the header (0: unknown).
	GrowthInterval int
	Steps          []Step
	Telemetry      []Telemetry
}

// Step is one optimizer step.
type Step struct {
	Step      int    `json:"step"`
	Epoch     *int   `json:"epoch"`
	Loss      *Float `json:"loss"`
	Scale     *Float `json:"scale"`
	ScaleUsed *Float `json:"scale_used"`
	Skipped   bool   `json:"skipped"`
}

// Telemetry is one telemetry line: per module, its gradients (as the
// step's scale made them) and, where the recorder measured them, its
// forward output and its own weights.
type Telemetry struct {
	Step      int               `json:"step"`
	Measured  string            `json:"measured"`
	ScaleUsed *Float            `json:"scale_used"`
	Modules   []TelemetryModule `json:"modules"`
}

// TelemetryModule is one module's entry in a telemetry line.
type TelemetryModule struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Output *Grad  `json:"output"`
	Params *Grad  `json:"params"`
	// Forward is its output in the forward pass, WeightMaxAbs the
	// largest |w| of its own parameters (both nil in logs of recorders
	// that did not measure them).
	Forward      *Forward `json:"forward"`
	WeightMaxAbs *Float   `json:"weight_max_abs"`
}

// Grad is the summary of one gradient.
type Grad struct {
	NonFinite int    `json:"nonfinite"`
	MaxAbs    *Float `json:"max_abs"`
	Sumsq     *Float `json:"sumsq"`
	LostMass  *Float `json:"lost_mass"`
}

// Forward is the summary of a module's forward output.
type Forward struct {
	MaxAbs    *Float `json:"max_abs"`
	NonFinite int    `json:"nonfinite"`
}

// ReadLog reads the capture's log.jsonl; nil without one. Lines of kinds
// it does not read are skipped, as the log format allows.
func (c *Capture) ReadLog() (*Log, error) {
	if c.Manifest.Log == nil || *c.Manifest.Log == "" {
		return nil, nil
	}
	path := c.Path(*c.Manifest.Log)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("capture log %s: %w", *c.Manifest.Log, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxLogLine)
	l := &Log{}
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var kind struct {
			Kind       string `json:"kind"`
			GradScaler *struct {
				GrowthInterval int `json:"growth_interval"`
			} `json:"grad_scaler"`
		}
		if err := json.Unmarshal(line, &kind); err != nil {
			return nil, fmt.Errorf("capture log %s:%d: %v", *c.Manifest.Log, n, err)
		}
		switch kind.Kind {
		case "header":
			if kind.GradScaler != nil {
				l.GrowthInterval = kind.GradScaler.GrowthInterval
			}
		case "step":
			var s Step
			if err := json.Unmarshal(line, &s); err != nil {
				return nil, fmt.Errorf("capture log %s:%d: step line: %v", *c.Manifest.Log, n, err)
			}
			l.Steps = append(l.Steps, s)
		case "telemetry":
			var t Telemetry
			if err := json.Unmarshal(line, &t); err != nil {
				return nil, fmt.Errorf("capture log %s:%d: telemetry line: %v", *c.Manifest.Log, n, err)
			}
			l.Telemetry = append(l.Telemetry, t)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("capture log %s: %w", *c.Manifest.Log, err)
	}
	return l, nil
}
