package report

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"sync"
)

// JSON has no NaN and no infinity, yet a document may hold them: an
// origin's constant -Inf, a loss that became NaN, a relative error
// against an all-zero reference. Every document therefore writes a float
// that is NaN or ±Inf as one of the strings NonFiniteNaN, NonFinitePosInf
// and NonFiniteNegInf, in whichever field it occurs, and reads those
// strings back (numbers read as usual). Finite floats are written exactly
// as encoding/json writes them. The documents' MarshalJSON and
// UnmarshalJSON apply this to every float field, including fields added
// later, by encoding through a copy of the document's type whose floats
// know the encoding; a program decoding a document with encoding/json into
// these types gets it for free.
const (
	NonFiniteNaN    = "nan"
	NonFinitePosInf = "inf"
	NonFiniteNegInf = "-inf"
)

// MarshalJSON writes the report with NaN and ±Inf as strings.
func (r Report) MarshalJSON() ([]byte, error) { return marshalDoc(&r) }

// UnmarshalJSON reads a report written by MarshalJSON.
func (r *Report) UnmarshalJSON(b []byte) error { return unmarshalDoc(b, r) }

// MarshalJSON writes the training audit with NaN and ±Inf as strings.
func (r TrainingReport) MarshalJSON() ([]byte, error) { return marshalDoc(&r) }

// UnmarshalJSON reads a training audit written by MarshalJSON.
func (r *TrainingReport) UnmarshalJSON(b []byte) error { return unmarshalDoc(b, r) }

// MarshalJSON writes the lint report with NaN and ±Inf as strings.
func (r LintReport) MarshalJSON() ([]byte, error) { return marshalDoc(&r) }

// UnmarshalJSON reads a lint report written by MarshalJSON.
func (r *LintReport) UnmarshalJSON(b []byte) error { return unmarshalDoc(b, r) }

// MarshalJSON writes the scales diagnosis with NaN and ±Inf as strings.
func (r ScalesReport) MarshalJSON() ([]byte, error) { return marshalDoc(&r) }

// UnmarshalJSON reads a scales diagnosis written by MarshalJSON.
func (r *ScalesReport) UnmarshalJSON(b []byte) error { return unmarshalDoc(b, r) }

// MarshalNonFinite is json.Marshal with NaN and ±Inf written as strings,
// for any value built from the documents' types (the renderers' page
// data).
func MarshalNonFinite(v any) ([]byte, error) {
	src := reflect.ValueOf(v)
	t := jsonType(src.Type())
	if t == src.Type() {
		return json.Marshal(v)
	}
	dst := reflect.New(t).Elem()
	convert(dst, src)
	return json.Marshal(dst.Interface())
}

// marshalDoc encodes the document doc points to through its float-aware
// twin type; the twin has no MarshalJSON, so this does not recurse.
func marshalDoc(doc any) ([]byte, error) {
	src := reflect.ValueOf(doc).Elem()
	dst := reflect.New(structTwin(src.Type())).Elem()
	convert(dst, src)
	return json.Marshal(dst.Interface())
}

// unmarshalDoc decodes b into the document doc points to through its twin.
func unmarshalDoc(b []byte, doc any) error {
	dst := reflect.ValueOf(doc).Elem()
	tw := reflect.New(structTwin(dst.Type()))
	if err := json.Unmarshal(b, tw.Interface()); err != nil {
		return err
	}
	convert(dst, tw.Elem())
	return nil
}

// jsonFloat is a float64 that encodes NaN and ±Inf as strings.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) { return appendFloat(nil, float64(f), 64), nil }

func (f *jsonFloat) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil // as encoding/json leaves a float at null
	}
	x, err := parseFloat(b, 64)
	*f = jsonFloat(x)
	return err
}

// jsonFloat32 is the same for float32 fields.
type jsonFloat32 float32

func (f jsonFloat32) MarshalJSON() ([]byte, error) { return appendFloat(nil, float64(f), 32), nil }

func (f *jsonFloat32) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	x, err := parseFloat(b, 32)
	*f = jsonFloat32(x)
	return err
}

// appendFloat writes x as encoding/json does (shortest representation,
// exponent form outside [1e-6, 1e21) with a one-digit negative exponent
// shortened), and a non-finite x as its string.
func appendFloat(b []byte, x float64, bits int) []byte {
	switch {
	case math.IsNaN(x):
		return strconv.AppendQuote(b, NonFiniteNaN)
	case math.IsInf(x, 1):
		return strconv.AppendQuote(b, NonFinitePosInf)
	case math.IsInf(x, -1):
		return strconv.AppendQuote(b, NonFiniteNegInf)
	}
	format := byte('f')
	if abs := math.Abs(x); abs != 0 && (bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21)) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, x, format, -1, bits)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// parseFloat reads a JSON number or one of the non-finite strings.
func parseFloat(b []byte, bits int) (float64, error) {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return 0, err
		}
		switch s {
		case NonFiniteNaN:
			return math.NaN(), nil
		case NonFinitePosInf:
			return math.Inf(1), nil
		case NonFiniteNegInf:
			return math.Inf(-1), nil
		}
		return 0, fmt.Errorf("float: want a number or %q, %q, %q, got the string %q", NonFiniteNaN, NonFinitePosInf, NonFiniteNegInf, s)
	}
	return strconv.ParseFloat(string(b), bits)
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	float64Twin       = reflect.TypeFor[jsonFloat]()
	float32Twin       = reflect.TypeFor[jsonFloat32]()
)

// twins caches jsonType; twinMu guards it and the building of twins.
var (
	twinMu sync.Mutex
	twins  = map[reflect.Type]reflect.Type{}
	// docTwins are the documents' own twins (structTwin).
	docTwins = map[reflect.Type]reflect.Type{}
	pairs    = map[[2]reflect.Type][]int{}
)

// jsonType returns the float-aware twin of t: t with every float replaced
// by jsonFloat (jsonFloat32), through pointers, slices, arrays, map values
// and struct fields. A type that encodes itself (a json.Marshaler or
// encoding.TextMarshaler) and a type without floats are their own twin.
func jsonType(t reflect.Type) reflect.Type {
	twinMu.Lock()
	defer twinMu.Unlock()
	return twinOf(t)
}

func twinOf(t reflect.Type) reflect.Type {
	if tw, ok := twins[t]; ok {
		return tw
	}
	// A placeholder breaks recursion through a self-referencing type: it
	// is then encoded as it is.
	twins[t] = t
	tw := makeTwin(t)
	twins[t] = tw
	return tw
}

func makeTwin(t reflect.Type) reflect.Type {
	if t.Implements(marshalerType) || t.Implements(textMarshalerType) ||
		reflect.PointerTo(t).Implements(marshalerType) || reflect.PointerTo(t).Implements(textMarshalerType) {
		return t
	}
	switch t.Kind() {
	case reflect.Float64:
		return float64Twin
	case reflect.Float32:
		return float32Twin
	case reflect.Pointer:
		if e := twinOf(t.Elem()); e != t.Elem() {
			return reflect.PointerTo(e)
		}
	case reflect.Slice:
		if e := twinOf(t.Elem()); e != t.Elem() {
			return reflect.SliceOf(e)
		}
	case reflect.Array:
		if e := twinOf(t.Elem()); e != t.Elem() {
			return reflect.ArrayOf(t.Len(), e)
		}
	case reflect.Map:
		if e := twinOf(t.Elem()); e != t.Elem() {
			return reflect.MapOf(t.Key(), e)
		}
	case reflect.Struct:
		if tw := buildStruct(t); !sameFields(tw, t) {
			return tw
		}
	}
	return t
}

// structTwin is struct type t with its exported fields' types replaced by
// their twins, tags kept; unexported fields, which encoding/json skips,
// are left out. It is built even when no field changes, as a document's
// own twin must lose the document's MarshalJSON.
func structTwin(t reflect.Type) reflect.Type {
	twinMu.Lock()
	defer twinMu.Unlock()
	if tw, ok := docTwins[t]; ok {
		return tw
	}
	tw := buildStruct(t)
	docTwins[t] = tw
	return tw
}

func buildStruct(t reflect.Type) reflect.Type {
	var fields []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		ft := twinOf(f.Type)
		if f.Anonymous && ft == f.Type && f.Type.Kind() == reflect.Struct {
			// An embedded struct's methods cannot be promoted to a built
			// type; its unnamed copy has none and encodes the same.
			ft = buildStruct(f.Type)
		}
		fields = append(fields, reflect.StructField{Name: f.Name, Type: ft, Tag: f.Tag, Anonymous: f.Anonymous})
	}
	return reflect.StructOf(fields)
}

// sameFields reports whether twin, a structTwin of t, changes nothing:
// then t is its own twin.
func sameFields(twin, t reflect.Type) bool {
	if twin.NumField() != t.NumField() {
		return false
	}
	for i := range t.NumField() {
		if twin.Field(i).Type != t.Field(i).Type {
			return false
		}
	}
	return true
}

// convert copies src into dst, where one's type is the other's twin (or
// the same type).
func convert(dst, src reflect.Value) {
	if dst.Type() == src.Type() {
		dst.Set(src)
		return
	}
	switch src.Kind() {
	case reflect.Float64, reflect.Float32:
		dst.SetFloat(src.Float())
	case reflect.Pointer:
		if src.IsNil() {
			return
		}
		dst.Set(reflect.New(dst.Type().Elem()))
		convert(dst.Elem(), src.Elem())
	case reflect.Slice:
		if src.IsNil() {
			return
		}
		dst.Set(reflect.MakeSlice(dst.Type(), src.Len(), src.Len()))
		for i := range src.Len() {
			convert(dst.Index(i), src.Index(i))
		}
	case reflect.Array:
		for i := range src.Len() {
			convert(dst.Index(i), src.Index(i))
		}
	case reflect.Map:
		if src.IsNil() {
			return
		}
		dst.Set(reflect.MakeMapWithSize(dst.Type(), src.Len()))
		e := reflect.New(dst.Type().Elem()).Elem()
		for it := src.MapRange(); it.Next(); {
			e.SetZero()
			convert(e, it.Value())
			dst.SetMapIndex(it.Key(), e)
		}
	case reflect.Struct:
		for i, j := range fieldPairs(dst.Type(), src.Type()) {
			if j >= 0 {
				convert(dst.Field(i), src.Field(j))
			}
		}
	}
}

// fieldPairs maps each field of struct type dst to the field of src of the
// same name (-1 for none): the twin has the exported fields only.
func fieldPairs(dst, src reflect.Type) []int {
	twinMu.Lock()
	defer twinMu.Unlock()
	key := [2]reflect.Type{dst, src}
	if p, ok := pairs[key]; ok {
		return p
	}
	p := make([]int, dst.NumField())
	for i := range p {
		p[i] = -1
		f := dst.Field(i)
		if !f.IsExported() {
			continue
		}
		for j := range src.NumField() {
			if src.Field(j).Name == f.Name {
				p[i] = j
				break
			}
		}
	}
	pairs[key] = p
	return p
}
