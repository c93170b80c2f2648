// Package capture reads the capture folder of a failing training step
// (docs/capture.md, format fp16audit.capture 1.x), written by the Python
// recorder, and refuses one it cannot trust. A capture is data shared
// between people, never code: Open checks every path the manifest and the
// ONNX model name before anything is opened (relative, inside the folder,
// no symlink on the way), every file's size and sha256 against the
// manifest, that no file is a pickle and no array needs one, and that the
// tensors' headers fit their files. Only ONNX, .npy/.npz arrays,
// safetensors headers and JSON are read.
package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Format is the manifest's "format"; Major the major version this
// package reads (every minor version of it, and every older major one).
const (
	Format = "fp16audit.capture"
	Major  = 1
	// ManifestFile is the manifest's name inside the folder.
	ManifestFile = "manifest.json"
)

// Trigger kinds (Trigger.Kind).
const (
	TriggerNonFiniteLoss = "nonfinite-loss"
	TriggerScaleCollapse = "scale-collapse"
	TriggerPinnedPlateau = "pinned-plateau"
	TriggerLossSpike     = "loss-spike"
	TriggerRequest       = "request"
)

// Triggers lists the trigger kinds format 1 defines.
func Triggers() []string {
	return []string{TriggerNonFiniteLoss, TriggerScaleCollapse, TriggerPinnedPlateau, TriggerLossSpike, TriggerRequest}
}

// Float is a manifest number: a JSON number, or one of the strings the
// recorder writes for what JSON cannot hold (NaN, Infinity, -Infinity).
type Float float64

// UnmarshalJSON reads a number or a non-finite float's string.
func (f *Float) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		switch strings.ToLower(s) {
		case "nan":
			*f = Float(math.NaN())
		case "infinity", "inf", "+infinity", "+inf":
			*f = Float(math.Inf(1))
		case "-infinity", "-inf":
			*f = Float(math.Inf(-1))
		default:
			return fmt.Errorf("want a number or NaN, Infinity, -Infinity, found the string %q", s)
		}
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("want a number, found %s", b)
	}
	*f = Float(v)
	return nil
}

// Manifest is manifest.json (docs/capture.md). Fields a reader of 1.x does
// not know are ignored; a missing optional entry is nil.
type Manifest struct {
	Format      string          `json:"format"`
	Version     string          `json:"version"`
	Created     string          `json:"created"`
	Trigger     Trigger         `json:"trigger"`
	Loss        Loss            `json:"loss"`
	Precision   Precision       `json:"precision"`
	GradScaler  *GradScaler     `json:"grad_scaler"`
	StepApplied bool            `json:"step_applied"`
	Optimizer   *Optimizer      `json:"optimizer"`
	Model       Model           `json:"model"`
	Batches     Batches         `json:"batches"`
	Log         *string         `json:"log"`
	RNG         *string         `json:"rng"`
	Trainer     string          `json:"trainer"`
	Versions    map[string]any  `json:"versions"`
	Device      Device          `json:"device"`
	Files       map[string]File `json:"files"`
}

// Trigger is why the capture was written.
type Trigger struct {
	Kind   string `json:"kind"`
	Step   int    `json:"step"`
	Epoch  *int   `json:"epoch"`
	Iter   *int   `json:"iter"`
	Detail string `json:"detail"`
}

// Loss is the step's loss and how fp16audit's backward audit computes it.
type Loss struct {
	Value       *Float  `json:"value"`
	Function    *string `json:"function"`
	Name        *string `json:"name"`
	ClassAxis   *string `json:"class_axis"`
	IgnoreIndex *int64  `json:"ignore_index"`
	LMShift     bool    `json:"lm_shift"`
	Output      *string `json:"output"`
}

// Precision is the policy the run trained under.
type Precision struct {
	Policy         string `json:"policy"`
	AutocastDevice string `json:"autocast_device"`
	DType          string `json:"dtype"`
}

// GradScaler is the scaler's state at the failing step; Scale the scale
// its backward used.
type GradScaler struct {
	Enabled        bool   `json:"enabled"`
	Class          string `json:"class"`
	Scale          *Float `json:"scale"`
	GrowthTracker  int    `json:"growth_tracker"`
	InitScale      *Float `json:"init_scale"`
	GrowthFactor   *Float `json:"growth_factor"`
	BackoffFactor  *Float `json:"backoff_factor"`
	GrowthInterval int    `json:"growth_interval"`
}

// Optimizer names the optimizer and its learning rate at the step.
type Optimizer struct {
	Class string `json:"class"`
	LR    *Float `json:"lr"`
	State string `json:"state"`
}

// Model is the exported model.
type Model struct {
	Path       string   `json:"path"`
	Class      string   `json:"class"`
	Exporter   string   `json:"exporter"`
	Mode       string   `json:"mode"`
	Inputs     []string `json:"inputs"`
	Outputs    []string `json:"outputs"`
	Parameters int64    `json:"parameters"`
	State      string   `json:"state"`
}

// Batches are the failing step's batch and the one before it.
type Batches struct {
	Failing  Batch  `json:"failing"`
	Previous *Batch `json:"previous"`
}

// Batch is one batch: its inputs (.npz, one member per model input) and
// its target (.npy; nil when the model returns its loss). Step is the
// previous batch's step.
type Batch struct {
	Inputs string  `json:"inputs"`
	Target *string `json:"target"`
	Step   *int    `json:"step"`
}

// Device is where the run trained.
type Device struct {
	Type          string `json:"type"`
	Name          string `json:"name"`
	BF16Supported bool   `json:"bf16_supported"`
}

// File is one file's size and sha256, as the manifest records them.
type File struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// version splits "M.m" into its numbers.
func version(v string) (major, minor int, err error) {
	a, b, ok := strings.Cut(v, ".")
	if !ok {
		b = "0"
	}
	if major, err = strconv.Atoi(a); err != nil || major < 0 {
		return 0, 0, fmt.Errorf("version %q: want major.minor, such as 1.0", v)
	}
	if minor, err = strconv.Atoi(b); err != nil || minor < 0 {
		return 0, 0, fmt.Errorf("version %q: want major.minor, such as 1.0", v)
	}
	return major, minor, nil
}

// paths returns every path the manifest names, with the field naming it.
func (m *Manifest) paths() [][2]string {
	var out [][2]string
	add := func(field, p string) {
		if p != "" {
			out = append(out, [2]string{field, p})
		}
	}
	add("model.path", m.Model.Path)
	add("model.state", m.Model.State)
	add("batches.failing.inputs", m.Batches.Failing.Inputs)
	if m.Batches.Failing.Target != nil {
		add("batches.failing.target", *m.Batches.Failing.Target)
	}
	if p := m.Batches.Previous; p != nil {
		add("batches.previous.inputs", p.Inputs)
		if p.Target != nil {
			add("batches.previous.target", *p.Target)
		}
	}
	if m.Log != nil {
		add("log", *m.Log)
	}
	if m.RNG != nil {
		add("rng", *m.RNG)
	}
	if m.Optimizer != nil {
		add("optimizer.state", m.Optimizer.State)
	}
	return out
}

// Scale is the loss scale the failing step's backward used; ok is false
// for a run without an enabled GradScaler.
func (m *Manifest) Scale() (float64, bool) {
	if m.GradScaler == nil || !m.GradScaler.Enabled || m.GradScaler.Scale == nil {
		return 0, false
	}
	return float64(*m.GradScaler.Scale), true
}

// LossValue is the step's loss (NaN when the manifest has none).
func (m *Manifest) LossValue() float64 {
	if m.Loss.Value == nil {
		return math.NaN()
	}
	return float64(*m.Loss.Value)
}
