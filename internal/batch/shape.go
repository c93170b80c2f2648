package batch

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"fp16audit/internal/tensor"
)

// ParseShape parses a --shape value such as "input_ids=1x128". Dimensions
// are separated by 'x' (or ','), and must be non-negative integers.
func ParseShape(s string) (name string, dims []int64, err error) {
	i := strings.LastIndexByte(s, '=')
	if i < 0 {
		return "", nil, fmt.Errorf("--shape %q: want name=DIMS such as input=1x3x224x224", s)
	}
	name, spec := s[:i], strings.TrimSpace(s[i+1:])
	if name == "" {
		return "", nil, fmt.Errorf("--shape %q: missing the input name before '='", s)
	}
	if spec == "" {
		return "", nil, fmt.Errorf("--shape %q: missing the dimensions after '='", s)
	}
	for _, part := range strings.FieldsFunc(spec, func(r rune) bool { return r == 'x' || r == 'X' || r == ',' }) {
		d, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil || d < 0 {
			return "", nil, fmt.Errorf("--shape %q: dimension %q is not a non-negative integer", s, part)
		}
		dims = append(dims, d)
	}
	if len(dims) == 0 || strings.Count(spec, "x")+strings.Count(spec, "X")+strings.Count(spec, ",") != len(dims)-1 {
		return "", nil, fmt.Errorf("--shape %q: want dimensions like 1x3x224x224", s)
	}
	return name, dims, nil
}

// checkPins verifies every --shape pin names an input and agrees with its
// rank and fixed dimensions.
func checkPins(specs []InputSpec, pins map[string][]int64) error {
	names := make([]string, 0, len(pins))
	for n := range pins {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		pin := pins[n]
		var spec *InputSpec
		for i := range specs {
			if specs[i].Name == n {
				spec = &specs[i]
			}
		}
		if spec == nil {
			list := make([]string, len(specs))
			for i, s := range specs {
				list[i] = strconv.Quote(s.Name)
			}
			return fmt.Errorf("--shape %s: the model has no input %q; its inputs are %s", n, n, strings.Join(list, ", "))
		}
		bad := spec.Dims != nil && len(pin) != len(spec.Dims)
		for k := 0; !bad && k < len(spec.Dims); k++ {
			bad = pin[k] < 0 || (spec.Dims[k] >= 0 && spec.Dims[k] != pin[k])
		}
		if bad {
			return fmt.Errorf("--shape %s=%s: input %q has shape %s in the model; a pin may only fix its symbolic dimensions",
				n, dimsArg(pin), n, wantString(*spec, nil))
		}
	}
	return nil
}

func dimsArg(dims []int64) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, "x")
}

func dimName(s InputSpec, k int) string {
	if k < len(s.DimNames) {
		return s.DimNames[k]
	}
	return ""
}

// wantString formats the expected shape with symbolic dims by name, such as
// [batch,3,224,224], and pinned ones as batch=8.
func wantString(s InputSpec, pin []int64) string {
	if s.Dims == nil && pin != nil {
		return tensor.ShapeString(pin)
	}
	parts := make([]string, len(s.Dims))
	for k, d := range s.Dims {
		name := dimName(s, k)
		switch {
		case d >= 0:
			parts[k] = strconv.FormatInt(d, 10)
		case pin != nil && name != "":
			parts[k] = name + "=" + strconv.FormatInt(pin[k], 10)
		case pin != nil:
			parts[k] = strconv.FormatInt(pin[k], 10)
		case name != "":
			parts[k] = name
		default:
			parts[k] = "?"
		}
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// expected returns the dims a batch must have: the pin where given, else the
// model's dims (-1 for free ones). nil means any shape.
func expected(s InputSpec, pin []int64) []int64 {
	if pin != nil {
		return pin
	}
	return s.Dims
}

func checkShape(s InputSpec, pin []int64, got []int64) error {
	want := expected(s, pin)
	if want == nil {
		return nil
	}
	ok := len(got) == len(want)
	for k := 0; ok && k < len(want); k++ {
		ok = want[k] < 0 || want[k] == got[k]
	}
	if ok {
		return nil
	}
	msg := fmt.Sprintf("want shape %s, got %s", wantString(s, pin), tensor.ShapeString(got))
	if hint := shapeHint(want, got); hint != "" {
		msg += " (" + hint + ")"
	}
	if pin != nil {
		msg += "; --shape " + s.Name + "=" + dimsArg(pin) + " pins it"
	}
	return fmt.Errorf("%s", msg)
}

// shapeHint guesses the usual mistakes behind a shape mismatch.
func shapeHint(want, got []int64) string {
	fits := func(w, g int64) bool { return w < 0 || w == g }
	r := len(want)
	if len(got) == r-1 {
		match := true
		for k := range got {
			match = match && fits(want[k+1], got[k])
		}
		if match {
			return "missing batch dimension? add one with x[None]"
		}
	}
	if len(got) == r && r >= 3 && want[1] >= 0 && got[r-1] == want[1] && got[1] != want[1] && fits(want[0], got[0]) {
		match := true
		for k := 2; k < r; k++ {
			match = match && fits(want[k], got[k-1])
		}
		if match {
			layout := map[int]string{3: "NCL", 4: "NCHW", 5: "NCDHW"}[r]
			if layout == "" {
				layout = "channels-first"
			}
			return "channels-last? transpose the batch to " + layout
		}
	}
	return ""
}

// convert returns t as element type want. Allowed: float64, float16,
// bfloat16 and integer data to float32 (pixels and counts are exact up to
// 2^24); float32/float16/bfloat16 to float64; lossless integer widening to
// int64. Anything else, notably float data for an integer input, is an
// error: silently truncating would audit different data than the user has.
func convert(t *tensor.Tensor, want tensor.DType) (*tensor.Tensor, string, error) {
	from := t.DType
	if from == want {
		return t, "", nil
	}
	note := fmt.Sprintf("converted %s data to %s", from, want)
	switch {
	case want == tensor.Float32 && from != tensor.Bool && from.Size() > 0 && from != tensor.String:
		vals, err := t.Float32s()
		if err != nil {
			return nil, "", err
		}
		if !from.IsFloat() {
			// Say so: raw 0-255 pixels stay raw, which the input checks flag.
			note += " (values kept as they are, not rescaled)"
		}
		return tensor.FromFloat32s(t.Name, t.Shape, vals), note, nil
	case want == tensor.Float64 && (from == tensor.Float32 || from == tensor.Float16 || from == tensor.BFloat16):
		vals, err := t.Float32s()
		if err != nil {
			return nil, "", err
		}
		data := make([]byte, 8*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint64(data[8*i:], math.Float64bits(float64(v)))
		}
		return &tensor.Tensor{Name: t.Name, DType: want, Shape: t.Shape, Data: data}, note, nil
	case want == tensor.Int64 && widensToInt64(from):
		n := int(tensor.NumElements(t.Shape))
		size := from.Size()
		if len(t.Data) != n*size {
			return nil, "", fmt.Errorf("%d bytes of data for shape %s of %s", len(t.Data), tensor.ShapeString(t.Shape), from)
		}
		data := make([]byte, 8*n)
		le := binary.LittleEndian
		for i := range n {
			var v int64
			switch from {
			case tensor.Int8:
				v = int64(int8(t.Data[i]))
			case tensor.Uint8:
				v = int64(t.Data[i])
			case tensor.Int16:
				v = int64(int16(le.Uint16(t.Data[2*i:])))
			case tensor.Uint16:
				v = int64(le.Uint16(t.Data[2*i:]))
			case tensor.Int32:
				v = int64(int32(le.Uint32(t.Data[4*i:])))
			case tensor.Uint32:
				v = int64(le.Uint32(t.Data[4*i:]))
			}
			le.PutUint64(data[8*i:], uint64(v))
		}
		return &tensor.Tensor{Name: t.Name, DType: want, Shape: t.Shape, Data: data}, note, nil
	}
	hint := "save the batch as " + want.String()
	switch {
	case want == tensor.Float16 || want == tensor.BFloat16:
		hint = fmt.Sprintf("the model takes %s input (exported after model.half()?); save the batch as %s", want, want)
	case from.IsFloat() && !want.IsFloat():
		hint = "the model wants integer data (token ids, indices or masks), not floats; save the batch as " + want.String()
	}
	return nil, "", fmt.Errorf("want dtype %s, got %s; %s", want, from, hint)
}

func widensToInt64(d tensor.DType) bool {
	switch d {
	case tensor.Int8, tensor.Uint8, tensor.Int16, tensor.Uint16, tensor.Int32, tensor.Uint32:
		return true
	}
	return false
}
