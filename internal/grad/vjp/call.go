package vjp

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"fp16audit/internal/onnx"
	"fp16audit/internal/onnx/ops"
)

// errNoRule marks an op without a vector–Jacobian product.
var errNoRule = errors.New("no gradient rule")

// call is one node's backward step. A rule reads the node, the gradients
// of its outputs (gy; "" where an output has none, which counts as zero)
// and which inputs need a gradient, emits nodes and sets dx for each input
// it differentiates. Inputs a rule leaves at "" get no contribution: an
// index, a shape, a running statistic.
type call struct {
	b    *Builder
	n    *onnx.NodeProto
	i    int
	gy   []string
	need []bool
	dx   []string

	nodes, inits, consts int
	marked               bool
}

// vjp is a rule: the vector–Jacobian product of one op type.
type rule func(c *call) error

// families are the gradient rules by the name an op's entry in
// internal/onnx/ops gives as its Grad ("unary", "conv", …); rules maps the
// op types of the default domain to theirs, built from the registry once
// every file's family is in.
var (
	families  = map[string]rule{}
	rules     map[string]rule
	rulesOnce sync.Once
)

// family registers the rule that the ops whose entry names it get.
func family(name string, r rule) { families[name] = r }

// ruleOf returns the rule of an op type of the default domain.
func ruleOf(opType string) (rule, bool) {
	rulesOnce.Do(func() {
		rules = map[string]rule{}
		for _, o := range ops.All() {
			if o.Domain != ops.Default || o.Grad == "" || o.Grad == ops.NoGrad {
				continue
			}
			r, ok := families[o.Grad]
			if !ok {
				panic(fmt.Sprintf("vjp: the entry of %s names the gradient rule %q, which package vjp does not have", o.Name, o.Grad))
			}
			rules[o.Name] = r
		}
	})
	r, ok := rules[opType]
	return r, ok
}

// Families returns the names of the gradient rules, sorted.
func Families() []string {
	out := make([]string, 0, len(families))
	for name := range families {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Ops returns the op types that have a gradient rule, sorted.
func Ops() []string {
	ruleOf("")
	out := make([]string, 0, len(rules))
	for op := range rules {
		out = append(out, op)
	}
	sort.Strings(out)
	return out
}

// in returns the name of input k, "" when absent.
func (c *call) in(k int) string {
	if k < len(c.n.Input) {
		return c.n.Input[k]
	}
	return ""
}

// out returns the name of output k, "" when absent.
func (c *call) out(k int) string {
	if k < len(c.n.Output) {
		return c.n.Output[k]
	}
	return ""
}

// wants reports whether input k needs a gradient.
func (c *call) wants(k int) bool { return k < len(c.need) && c.need[k] }

// shape returns the static shape of a forward value.
func (c *call) shape(v string) ([]int64, error) { return c.b.shape(v) }

// shapes returns the static shapes of several values.
func (c *call) shapes(vs ...string) ([][]int64, error) {
	out := make([][]int64, len(vs))
	for i, v := range vs {
		s, err := c.b.shape(v)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// g returns the gradient of output 0, which every single-output rule
// starts from.
func (c *call) g() string { return c.gy[0] }

// set records the contribution to input k when it needs one.
func (c *call) set(k int, dx string) {
	if c.wants(k) {
		c.dx[k] = dx
	}
}

// mark remembers how much was emitted before the rule ran.
func (c *call) mark() {
	c.nodes, c.inits, c.consts, c.marked = len(c.b.nodes), len(c.b.inits), len(c.b.consts), true
}

// rollback drops what a failed rule emitted, so that an unsupported node
// leaves no dead nodes behind.
func (c *call) rollback() {
	if !c.marked {
		return
	}
	b := c.b
	for _, n := range b.nodes[c.nodes:] {
		for _, o := range n.Output {
			delete(b.produced, o)
		}
	}
	b.nodes = b.nodes[:c.nodes]
	for _, t := range b.inits[c.inits:] {
		for k, v := range b.consts {
			if v == t.Name {
				delete(b.consts, k)
			}
		}
	}
	b.inits = b.inits[:c.inits]
	// used may keep names of dropped nodes' inputs: that only makes a
	// later rename go through an Identity, never wrong.
}

// errorf reports a rule's precondition failure for this node.
func (c *call) errorf(format string, args ...any) error {
	return fmt.Errorf(format, args...)
}

// normAxis resolves a possibly negative axis against rank r.
func normAxis(a int64, r int) int64 {
	if a < 0 {
		a += int64(r)
	}
	return a
}

// inversePerm inverts a permutation.
func inversePerm(p []int64) []int64 {
	inv := make([]int64, len(p))
	for i, v := range p {
		inv[v] = int64(i)
	}
	return inv
}

// iota64 returns [from, from+1, ..., to-1].
func iota64(from, to int) []int64 {
	out := make([]int64, 0, max(0, to-from))
	for i := from; i < to; i++ {
		out = append(out, int64(i))
	}
	return out
}

// keepdimsShape is shape with the given axes set to 1.
func keepdimsShape(shape []int64, axes []int64) []int64 {
	out := slices.Clone(shape)
	for _, a := range axes {
		out[a] = 1
	}
	return out
}
