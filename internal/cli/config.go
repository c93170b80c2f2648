package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"

	"fp16audit/checks"
	"fp16audit/internal/precision"
)

// configName is the file a repository commits its audit settings in.
const configName = ".fp16audit.toml"

// fileConfig is the content of a config file:
//
//	policy  = "half"
//	checks  = "all,-FP3*"         # or ["all", "-FP3*"]
//	fail_on = "error"
//
//	[models."models/resnet.onnx"]
//	inputs = ["input=batches/x.npy"]
type fileConfig struct {
	Policy string                 `toml:"policy"`
	Checks checkList              `toml:"checks"`
	FailOn string                 `toml:"fail_on"`
	Models map[string]modelConfig `toml:"models"`
}

// modelConfig holds the settings of one model, keyed by its path relative
// to the config file.
type modelConfig struct {
	// Inputs are -i values: NAME=PATH or PATH, with PATH relative to the
	// config file.
	Inputs []string `toml:"inputs"`
}

// checkList is a --checks value written as a string or an array of
// entries.
type checkList string

// UnmarshalTOML accepts "all,-FP3*" and ["all", "-FP3*"].
func (c *checkList) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		*c = checkList(v)
		return nil
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return fmt.Errorf("checks: entry %v is not a string", e)
			}
			parts[i] = s
		}
		*c = checkList(strings.Join(parts, ","))
		return nil
	}
	return fmt.Errorf("checks: want a string such as \"all,-FP3*\" or an array of strings, got %T", v)
}

// config is a loaded config file.
type config struct {
	// Path is the file as found; Dir is its folder, against which model
	// keys and input paths resolve.
	Path, Dir string
	fileConfig
}

// findConfig returns the config file that applies to a model: the first
// .fp16audit.toml in the model's folder or above it, stopping after the
// repository root (a folder holding .git) or at the filesystem root. It
// returns "" when there is none.
func findConfig(modelPath string) (string, error) {
	dir, err := filepath.Abs(filepath.Dir(modelPath))
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, configName)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("config %s: %w", p, err)
		}
		if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
			return "", nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", nil
		}
		dir = parent
	}
}

var configKeys = "policy, checks, fail_on and [models.\"PATH\"] tables with inputs"

// loadConfig reads and checks a config file. Errors name the file and the
// offending key.
func loadConfig(path string) (*config, error) {
	c := &config{Path: path, Dir: filepath.Dir(path)}
	md, err := toml.DecodeFile(path, &c.fileConfig)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("config %s: line %d: %s", path, perr.Position.Line, perr.Message)
		}
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = fmt.Sprintf("%q", k[len(k)-1])
			if len(k) > 1 {
				keys[i] += " in [" + k[:len(k)-1].String() + "]"
			}
		}
		return nil, fmt.Errorf("config %s: unknown key %s; the keys are %s", path, strings.Join(keys, ", "), configKeys)
	}
	if c.Policy != "" {
		if _, err := precision.PolicyByName(c.Policy); err != nil {
			return nil, fmt.Errorf("config %s: policy: %w", path, err)
		}
	}
	if c.FailOn != "" {
		if _, ok := failOnLevels[c.FailOn]; !ok {
			return nil, fmt.Errorf("config %s: fail_on %q: want error, warning or never", path, c.FailOn)
		}
	}
	if c.Checks != "" {
		if _, err := checks.ParseSelection(string(c.Checks)); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	for key, m := range c.Models {
		for _, in := range m.Inputs {
			if strings.TrimSpace(in) == "" {
				return nil, fmt.Errorf("config %s: models.%q.inputs: empty entry; want NAME=PATH or PATH", path, key)
			}
		}
	}
	return c, nil
}

// model returns the settings of the model at modelPath, if the config has
// a [models."PATH"] table naming that file.
func (c *config) model(modelPath string) (modelConfig, bool) {
	abs, err := filepath.Abs(modelPath)
	if err != nil {
		return modelConfig{}, false
	}
	keys := make([]string, 0, len(c.Models))
	for k := range c.Models {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := filepath.FromSlash(k)
		if !filepath.IsAbs(p) {
			p = filepath.Join(c.Dir, p)
		}
		if filepath.Clean(p) == abs {
			return c.Models[k], true
		}
	}
	return modelConfig{}, false
}

// inputs returns the model's -i values with their paths resolved against
// the config file's folder: "NAME=PATH" splits at the first '='.
func (c *config) inputs(modelPath string) []string {
	m, ok := c.model(modelPath)
	if !ok {
		return nil
	}
	out := make([]string, len(m.Inputs))
	for i, in := range m.Inputs {
		name, path, named := strings.Cut(in, "=")
		if !named {
			name, path = "", in
		}
		path = filepath.FromSlash(path)
		if !filepath.IsAbs(path) {
			path = filepath.Join(c.Dir, path)
		}
		if named {
			out[i] = name + "=" + path
		} else {
			out[i] = path
		}
	}
	return out
}

// configCache loads each config file once per command.
type configCache map[string]*config

// forModel returns the config that applies to modelPath, or nil.
func (cc configCache) forModel(modelPath string) (*config, error) {
	path, err := findConfig(modelPath)
	if err != nil || path == "" {
		return nil, err
	}
	if c, ok := cc[path]; ok {
		return c, nil
	}
	c, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	cc[path] = c
	return c, nil
}

// settings are the policy, check selection and failing level that apply
// to one model after the config file and the flags.
type settings struct {
	policy, checks, failOn string
	config                 string // the config file used, or ""
	inputs                 []string
}

// resolve applies c (which may be nil) to the flag values in s: a flag the
// user set wins over the config file, which wins over the flag's default.
func (s settings) resolve(fs *pflag.FlagSet, c *config, modelPath string) settings {
	if c == nil {
		return s
	}
	s.config = c.Path
	if c.Policy != "" && !fs.Changed("policy") {
		s.policy = c.Policy
	}
	if c.Checks != "" && !fs.Changed("checks") {
		s.checks = string(c.Checks)
	}
	if c.FailOn != "" && !fs.Changed("fail-on") {
		s.failOn = c.FailOn
	}
	if !fs.Changed("input") {
		if in := c.inputs(modelPath); len(in) > 0 {
			s.inputs = in
		}
	}
	return s
}

// applyRunConfig applies the config file of run's model and checks the
// --checks selection. It returns an exit code when run must stop, or -1.
func applyRunConfig(fs *pflag.FlagSet, o *runOptions, stderr io.Writer) int {
	if fs.NArg() == 1 {
		c, err := configCache{}.forModel(fs.Arg(0))
		if err != nil {
			fmt.Fprintf(stderr, "fp16audit run: %v\n", err)
			return exitUsage
		}
		s := settings{policy: o.policy, checks: o.checks, failOn: o.failOn, inputs: o.inputs}.resolve(fs, c, fs.Arg(0))
		o.policy, o.checks, o.failOn, o.inputs = s.policy, s.checks, s.failOn, s.inputs
	}
	if _, err := checks.ParseSelection(o.checks); err != nil {
		fmt.Fprintf(stderr, "fp16audit run: --checks: %v\n", err)
		return exitUsage
	}
	return -1
}
