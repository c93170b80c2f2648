// Package batch reads the sample batches a user gives fp16audit (.npy, .npz,
// ONNX TensorProto .pb files and folders of them), binds them to the model's
// inputs, checks shapes and element types against the model, and generates
// seeded synthetic batches when none are given.
package batch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"fp16audit/internal/tensor"
)

// InputSpec describes one model input as the graph declares it.
type InputSpec struct {
	Name  string
	DType tensor.DType
	// Dims holds the declared dimensions, -1 for a symbolic one. A nil Dims
	// means the model declares no shape, so any rank is accepted; a scalar
	// input has a non-nil empty Dims.
	Dims []int64
	// DimNames holds each dimension's dim_param, or "" (optional; may be
	// shorter than Dims).
	DimNames []string
	// Meaning is what the input holds (token ids, a mask, positions...),
	// and Rows the size of the smallest table it indexes (0: none); they
	// decide what a synthetic batch puts there.
	Meaning Meaning
	Rows    int64
}

// ErrEmpty marks a float input without values: an empty batch.
var ErrEmpty = errors.New("an empty batch")

// Batch is one set of model inputs.
type Batch struct {
	// Source names where the batch came from: a file, a folder, several of
	// them joined by ", ", or "synthetic …".
	Source string
	// Inputs holds one tensor per InputSpec, in the same order, named after
	// the spec and converted to its element type.
	Inputs []*tensor.Tensor
	// Saved holds, per input, the element type the data had where it was
	// read (before any conversion); the input's own type for synthetic
	// data.
	Saved []tensor.DType
}

// Note records something Load did that the user should know: a dtype
// conversion, or synthetic data in place of real batches. Input is empty for
// notes about the whole load.
type Note struct {
	Input, Text string
}

// Options says where the batches come from.
type Options struct {
	// Args holds the -i values, each "name=path" or "path".
	Args []string
	// Shapes pins input shapes (from --shape name=1x3x224x224). Pins must
	// agree with the model's fixed dimensions; batches must match them.
	Shapes map[string][]int64
	// Seed seeds the synthetic batches.
	Seed int64
	// SyntheticBatches is the number of synthetic batches made when Args is
	// empty; 0 means 1.
	SyntheticBatches int
}

// Load reads the batches named by opt.Args and binds them to specs.
//
// "-i name=path" binds path to the named input; "-i path" binds to the next
// input, in model order, that no named -i claims. A path is a file or a
// folder:
//
//   - a .npy or .pb file is one batch for one input;
//   - an .npz file is one batch: given without a name its members bind to
//     the inputs by member name (all inputs at once); np.savez's positional
//     names arr_0, arr_1, … bind in input order; given with a name, the
//     member of that name (or the only member) is used;
//   - an ONNX test-data folder (input_0.pb, input_1.pb, …) is one batch whose
//     tensors bind by name when every name is a model input, else in order;
//   - a folder of test_data_set_* folders is one batch per folder;
//   - a folder whose .npy files are named after two or more model inputs is
//     one batch bound by name;
//   - any other folder of .npy, .pb or .npz files is one batch per file,
//     taken in file-name order.
//
// Every input must be bound exactly once, and every -i must give the same
// number of batches. Shapes must match the model's rank and fixed
// dimensions, the --shape pins, and each other where inputs share a
// dim_param. Element types are converted where no information that matters
// is lost (see convert); each conversion is reported once per input as a
// Note. Errors about a file start with its path.
//
// With no Args, Load makes synthetic batches instead; see Synthesize.
func Load(specs []InputSpec, opt Options) ([]Batch, []Note, error) {
	if len(specs) == 0 {
		return nil, nil, fmt.Errorf("the model has no inputs to bind batches to")
	}
	if err := checkPins(specs, opt.Shapes); err != nil {
		return nil, nil, err
	}
	if len(opt.Args) == 0 {
		return Synthesize(specs, opt)
	}
	b := &binder{specs: specs, pins: opt.Shapes, byName: map[string]int{}}
	for i, s := range specs {
		b.byName[s.Name] = i
	}
	srcs := make([]*source, 0, len(opt.Args))
	for _, arg := range opt.Args {
		src, err := b.parseArg(arg)
		if err != nil {
			return nil, nil, err
		}
		if src.groups, err = readSource(src.path, len(specs) > 1, b.byName); err != nil {
			return nil, nil, err
		}
		srcs = append(srcs, src)
	}
	if err := b.bindAll(srcs); err != nil {
		return nil, nil, err
	}
	return b.assemble(srcs)
}

// item is one tensor and the file it came from.
type item struct {
	path string
	t    *tensor.Tensor
}

// group is what one file or test-data folder holds: one batch's worth.
type group struct {
	origin string
	items  []item
	// multi marks containers (npz, test-data folders, folders of per-input
	// .npy files) whose tensors bind by name or position, as opposed to a
	// single-array file.
	multi bool
	// ordered marks test-data folders, whose tensors are in input order.
	ordered bool
}

// source is one -i value.
type source struct {
	arg, name, path string
	groups          []group
	// inputs lists the model inputs this source feeds; items[k][j] feeds
	// inputs[j] in batch k.
	inputs []int
	items  [][]item
}

type binder struct {
	specs  []InputSpec
	pins   map[string][]int64
	byName map[string]int
}

func (b *binder) inputList() string {
	names := make([]string, len(b.specs))
	for i, s := range b.specs {
		names[i] = strconv.Quote(s.Name)
	}
	return strings.Join(names, ", ")
}

// parseArg splits "name=path". A prefix before '=' that names no input is
// part of the path when that path exists.
func (b *binder) parseArg(arg string) (*source, error) {
	if arg == "" {
		return nil, fmt.Errorf("-i: empty value; want name=path or path")
	}
	for i := 0; i < len(arg); i++ {
		if arg[i] != '=' {
			continue
		}
		if _, ok := b.byName[arg[:i]]; ok {
			if arg[i+1:] == "" {
				return nil, fmt.Errorf("-i %s: missing path after '='", arg)
			}
			return &source{arg: arg, name: arg[:i], path: arg[i+1:]}, nil
		}
	}
	if i := strings.IndexByte(arg, '='); i > 0 {
		if _, err := os.Stat(arg); err != nil {
			return nil, &LoadError{Path: arg[i+1:], Err: fmt.Errorf("-i %s: the model has no input %q; its inputs are %s", arg, arg[:i], b.inputList())}
		}
	}
	return &source{arg: arg, path: arg}, nil
}

// readSource reads everything a path holds. manyInputs and byName decide
// whether a folder of .npy files named after inputs is one batch.
func readSource(path string, manyInputs bool, byName map[string]int) ([]group, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, pathError(path, err)
	}
	if !st.IsDir() {
		g, err := readFileGroup(path)
		if err != nil {
			return nil, err
		}
		return []group{g}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, pathError(path, err)
	}
	var sets, files []string
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, "."):
		case e.IsDir() && strings.HasPrefix(name, "test_data_set_"):
			sets = append(sets, name)
		case !e.IsDir() && name == "input_0.pb":
			g, err := readTestDataGroup(path)
			if err != nil {
				return nil, err
			}
			return []group{g}, nil
		case !e.IsDir() && isBatchFile(name):
			files = append(files, name)
		}
	}
	if len(sets) > 0 {
		sortNatural(sets)
		groups := make([]group, 0, len(sets))
		for _, s := range sets {
			g, err := readTestDataGroup(filepath.Join(path, s))
			if err != nil {
				return nil, err
			}
			groups = append(groups, g)
		}
		return groups, nil
	}
	if len(files) == 0 {
		return nil, &LoadError{Path: path, Err: fmt.Errorf("folder holds no .npy, .npz or .pb files and no ONNX test data (input_0.pb or test_data_set_*)")}
	}
	sort.Strings(files)
	var npz, other int
	for _, f := range files {
		if strings.EqualFold(filepath.Ext(f), ".npz") {
			npz++
		} else {
			other++
		}
	}
	if npz > 0 && other > 0 {
		return nil, &LoadError{Path: path, Err: fmt.Errorf("folder mixes .npz files with .npy/.pb files; use one .npz per batch or one .npy per batch")}
	}
	groups := make([]group, 0, len(files))
	for _, f := range files {
		g, err := readFileGroup(filepath.Join(path, f))
		if err != nil {
			return nil, err
		}
		groups = append(groups, g)
	}
	if npz == 0 && manyInputs && len(groups) > 1 && namedAfterInputs(groups, byName) {
		merged := group{origin: path, multi: true}
		for _, g := range groups {
			merged.items = append(merged.items, g.items...)
		}
		return []group{merged}, nil
	}
	return groups, nil
}

// namedAfterInputs reports whether each single-array group's file is named
// after a different model input.
func namedAfterInputs(groups []group, byName map[string]int) bool {
	seen := map[string]bool{}
	for _, g := range groups {
		n := stem(g.origin)
		if _, ok := byName[n]; !ok || seen[n] {
			return false
		}
		seen[n] = true
	}
	for _, g := range groups {
		g.items[0].t.Name = stem(g.origin)
	}
	return true
}

func isBatchFile(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".npy", ".npz", ".pb":
		return true
	}
	return false
}

func readFileGroup(path string) (group, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npy":
		t, err := ReadNPY(path)
		if err != nil {
			return group{}, pathError(path, err)
		}
		return group{origin: path, items: []item{{path, t}}}, nil
	case ".pb":
		t, err := ReadPB(path)
		if err != nil {
			return group{}, pathError(path, err)
		}
		return group{origin: path, items: []item{{path, t}}}, nil
	case ".npz":
		ts, err := ReadNPZ(path)
		if err != nil {
			return group{}, pathError(path, err)
		}
		g := group{origin: path, multi: true}
		for _, t := range ts {
			g.items = append(g.items, item{path, t})
		}
		return g, nil
	}
	return group{}, &LoadError{Path: path, Err: fmt.Errorf("unknown batch file type %q; want .npy, .npz, .pb or a folder", filepath.Ext(path))}
}

func readTestDataGroup(dir string) (group, error) {
	ins, _, err := ReadTestDataSet(dir)
	if err != nil {
		return group{}, pathError(dir, err)
	}
	g := group{origin: dir, multi: true, ordered: true}
	for i, t := range ins {
		g.items = append(g.items, item{filepath.Join(dir, fmt.Sprintf("input_%d.pb", i)), t})
	}
	return g, nil
}

// sortNatural sorts names so that embedded numbers compare by value:
// test_data_set_2 before test_data_set_10.
func sortNatural(names []string) {
	slices.SortFunc(names, func(a, b string) int {
		for a != "" && b != "" {
			da, db := digitPrefix(a), digitPrefix(b)
			if da > 0 && db > 0 {
				na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
				if c := len(na) - len(nb); c != 0 {
					return c
				}
				if c := strings.Compare(na, nb); c != 0 {
					return c
				}
				a, b = a[da:], b[db:]
				continue
			}
			if a[0] != b[0] {
				return int(a[0]) - int(b[0])
			}
			a, b = a[1:], b[1:]
		}
		return len(a) - len(b)
	})
}

func digitPrefix(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// bindAll decides which inputs each source feeds: named sources first, then
// positional containers (by member name or order), then positional single
// arrays in input order over what is left.
func (b *binder) bindAll(srcs []*source) error {
	owner := make([]*source, len(b.specs))
	claim := func(src *source, i int) error {
		if prev := owner[i]; prev != nil {
			return &LoadError{Path: src.path, Err: fmt.Errorf("input %q is bound twice: by -i %s and by -i %s", b.specs[i].Name, prev.arg, src.arg)}
		}
		owner[i] = src
		return nil
	}
	var singles []*source
	for pass := 0; pass < 2; pass++ {
		for _, src := range srcs {
			if (src.name != "") != (pass == 0) {
				continue
			}
			single, err := b.resolve(src)
			if err != nil {
				return err
			}
			if single {
				if pass == 0 {
					src.inputs = []int{b.byName[src.name]}
				} else {
					singles = append(singles, src)
					continue
				}
			}
			for _, i := range src.inputs {
				if err := claim(src, i); err != nil {
					return err
				}
			}
		}
	}
	next := 0
	for _, src := range singles {
		for next < len(owner) && owner[next] != nil {
			next++
		}
		if next == len(owner) {
			return &LoadError{Path: src.path, Err: fmt.Errorf("more -i values than model inputs: every input is already bound; the model's inputs are %s", b.inputList())}
		}
		src.inputs = []int{next}
		owner[next] = src
	}
	var missing []string
	for i, o := range owner {
		if o == nil {
			missing = append(missing, strconv.Quote(b.specs[i].Name))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no batch for input %s; the model's inputs are %s; bind each with -i name=path", strings.Join(missing, ", "), b.inputList())
	}
	return nil
}

// resolve fills src.inputs and src.items from its groups. It reports single
// when each group is one array for one input whose index the caller decides.
func (b *binder) resolve(src *source) (single bool, err error) {
	for k, g := range src.groups {
		idx, items, gSingle, err := b.resolveGroup(g, src.name)
		if err != nil {
			return false, err
		}
		if k == 0 {
			single, src.inputs = gSingle, idx
		} else if gSingle != single || !slices.Equal(idx, src.inputs) {
			return false, &LoadError{Path: g.origin, Err: fmt.Errorf("feeds %s but %s feeds %s; every batch in -i %s must hold the same inputs",
				b.describe(idx, gSingle), src.groups[0].origin, b.describe(src.inputs, single), src.arg)}
		}
		src.items = append(src.items, items)
	}
	return single, nil
}

func (b *binder) describe(idx []int, single bool) string {
	if single {
		return "one array"
	}
	names := make([]string, len(idx))
	for j, i := range idx {
		names[j] = strconv.Quote(b.specs[i].Name)
	}
	return "inputs " + strings.Join(names, ", ")
}

func (b *binder) resolveGroup(g group, name string) (idx []int, items []item, single bool, err error) {
	if !g.multi || len(g.items) == 1 {
		if g.multi && name == "" && !g.ordered {
			// A one-member npz named after an input binds by name.
			if i, ok := b.byName[g.items[0].t.Name]; ok {
				return []int{i}, g.items, false, nil
			}
		}
		return nil, g.items[:1], true, nil
	}
	names := make([]string, len(g.items))
	for j, it := range g.items {
		names[j] = strconv.Quote(it.t.Name)
	}
	if name != "" {
		for _, it := range g.items {
			if it.t.Name == name {
				return nil, []item{it}, true, nil
			}
		}
		return nil, nil, false, &LoadError{Path: g.origin, Err: fmt.Errorf("holds %s; none is named %q, so -i %s=… cannot pick one", strings.Join(names, ", "), name, name)}
	}
	idx = make([]int, len(g.items))
	byName := true
	seen := map[int]bool{}
	for j, it := range g.items {
		i, ok := b.byName[it.t.Name]
		if !ok || seen[i] {
			byName = false
			break
		}
		seen[i] = true
		idx[j] = i
	}
	if byName {
		return idx, g.items, false, nil
	}
	if g.ordered || savezNames(g.items) {
		if len(g.items) > len(b.specs) {
			return nil, nil, false, &LoadError{Path: g.origin, Err: fmt.Errorf("holds %d arrays but the model has %d inputs (%s)", len(g.items), len(b.specs), b.inputList())}
		}
		for j := range idx {
			idx[j] = j
		}
		return idx, g.items, false, nil
	}
	return nil, nil, false, &LoadError{Path: g.origin, Err: fmt.Errorf("holds %s, which do not match the model's inputs %s; name the arrays after the inputs or bind one with -i name=path", strings.Join(names, ", "), b.inputList())}
}

// savezNames reports whether items carry np.savez's positional names arr_0,
// arr_1, … in order.
func savezNames(items []item) bool {
	for j, it := range items {
		if it.t.Name != "arr_"+strconv.Itoa(j) {
			return false
		}
	}
	return true
}

// assemble checks batch counts, then validates and converts every tensor.
func (b *binder) assemble(srcs []*source) ([]Batch, []Note, error) {
	n := len(srcs[0].items)
	for _, src := range srcs[1:] {
		if len(src.items) != n {
			return nil, nil, &LoadError{Path: src.path, Err: fmt.Errorf("gives %d batches but %s gives %d; every -i must give the same number of batches",
				len(src.items), srcs[0].path, n)}
		}
	}
	notes := &noteSet{}
	batches := make([]Batch, n)
	for k := range n {
		inputs := make([]*tensor.Tensor, len(b.specs))
		saved := make([]tensor.DType, len(b.specs))
		paths := make([]string, len(b.specs))
		var origins []string
		for _, src := range srcs {
			if o := src.groups[k].origin; !slices.Contains(origins, o) {
				origins = append(origins, o)
			}
			for j, i := range src.inputs {
				it := src.items[k][j]
				t, note, err := b.prepare(i, it.t)
				if err != nil {
					return nil, nil, &LoadError{Path: it.path, Err: err}
				}
				if note != "" {
					notes.add(Note{Input: b.specs[i].Name, Text: note})
				}
				inputs[i], paths[i], saved[i] = t, it.path, it.t.DType
			}
		}
		if err := b.checkDimNames(inputs, paths); err != nil {
			return nil, nil, err
		}
		batches[k] = Batch{Source: strings.Join(origins, ", "), Inputs: inputs, Saved: saved}
	}
	return batches, notes.list, nil
}

// prepare checks t's shape against input i and converts its element type.
func (b *binder) prepare(i int, t *tensor.Tensor) (*tensor.Tensor, string, error) {
	spec := b.specs[i]
	if err := checkShape(spec, b.pins[spec.Name], t.Shape); err != nil {
		return nil, "", fmt.Errorf("input %q: %w", spec.Name, err)
	}
	if slices.Contains(t.Shape, 0) && (t.DType.IsFloat() || spec.DType.IsFloat()) {
		return nil, "", fmt.Errorf("input %q: shape %s holds no values (a dimension is 0): %w that audits nothing and would pass any check; save a batch with at least one sample, e.g. xb[:8]",
			spec.Name, tensor.ShapeString(t.Shape), ErrEmpty)
	}
	out, note, err := convert(t, spec.DType)
	if err != nil {
		return nil, "", fmt.Errorf("input %q: %w", spec.Name, err)
	}
	if out == t {
		cp := *t
		out = &cp
	}
	out.Name = spec.Name
	return out, note, nil
}

// checkDimNames enforces that inputs sharing a symbolic dim_param agree on
// its value, as the ONNX IR defines dim_param.
func (b *binder) checkDimNames(inputs []*tensor.Tensor, paths []string) error {
	type seen struct {
		v     int64
		input int
	}
	vals := map[string]seen{}
	for i, s := range b.specs {
		for k, name := range s.DimNames {
			if name == "" || k >= len(s.Dims) || s.Dims[k] >= 0 || k >= len(inputs[i].Shape) {
				continue
			}
			v := inputs[i].Shape[k]
			if prev, ok := vals[name]; ok && prev.v != v {
				return &LoadError{Path: paths[i], Err: fmt.Errorf("input %q: dim %q is %d, but input %q (%s) has %q = %d; inputs sharing a dim name must agree",
					s.Name, name, v, b.specs[prev.input].Name, paths[prev.input], name, prev.v)}
			} else if !ok {
				vals[name] = seen{v, i}
			}
		}
	}
	return nil
}

type noteSet struct{ list []Note }

func (s *noteSet) add(n Note) {
	if !slices.Contains(s.list, n) {
		s.list = append(s.list, n)
	}
}
