package batch

import (
	"fmt"
	"strconv"
	"strings"
)

// The .npy header is a Python dict literal. pyParser reads the small subset
// numpy writes (dicts with string keys, strings, True/False/None, ints,
// tuples and lists) and refuses everything else rather than guessing.

type (
	pyTuple []any
	pyList  []any
	pyNone  struct{}
	pyDict  struct {
		keys []string
		vals map[string]any
	}
)

// maxPyDepth bounds nesting so hostile headers cannot exhaust the stack.
const maxPyDepth = 16

type pyParser struct {
	s []byte
	i int
}

func (p *pyParser) skipSpace() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			p.i++
		default:
			return
		}
	}
}

func (p *pyParser) rest() string {
	r := string(p.s[p.i:])
	if len(r) > 20 {
		r = r[:20] + "..."
	}
	return r
}

func (p *pyParser) errorf(format string, args ...any) error {
	return fmt.Errorf("malformed header dict at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *pyParser) value(depth int) (any, error) {
	if depth > maxPyDepth {
		return nil, p.errorf("nested too deeply")
	}
	p.skipSpace()
	if p.i >= len(p.s) {
		return nil, p.errorf("unexpected end of header")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.dict(depth)
	case c == '(':
		p.i++
		items, trailingComma, err := p.items(')', depth)
		if err != nil {
			return nil, err
		}
		if len(items) == 1 && !trailingComma {
			// (3) is the int 3 in Python, not a tuple.
			return items[0], nil
		}
		return pyTuple(items), nil
	case c == '[':
		p.i++
		items, _, err := p.items(']', depth)
		if err != nil {
			return nil, err
		}
		return pyList(items), nil
	case c == '\'' || c == '"':
		return p.str()
	case c == '-' || c == '+' || (c >= '0' && c <= '9'):
		return p.integer()
	case isIdentByte(c):
		start := p.i
		for p.i < len(p.s) && isIdentByte(p.s[p.i]) {
			p.i++
		}
		switch w := string(p.s[start:p.i]); w {
		case "True":
			return true, nil
		case "False":
			return false, nil
		case "None":
			return pyNone{}, nil
		default:
			p.i = start
			return nil, p.errorf("unexpected name %q", w)
		}
	default:
		return nil, p.errorf("unexpected %q", p.rest())
	}
}

func isIdentByte(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// items parses comma-separated values up to end; the opening bracket has been
// consumed.
func (p *pyParser) items(end byte, depth int) ([]any, bool, error) {
	var out []any
	trailing := false
	for {
		p.skipSpace()
		if p.i < len(p.s) && p.s[p.i] == end {
			p.i++
			return out, trailing, nil
		}
		if len(out) > 0 && !trailing {
			return nil, false, p.errorf("want ',' or %q", end)
		}
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, false, err
		}
		out = append(out, v)
		p.skipSpace()
		trailing = p.i < len(p.s) && p.s[p.i] == ','
		if trailing {
			p.i++
		}
	}
}

func (p *pyParser) dict(depth int) (any, error) {
	p.i++ // '{'
	d := pyDict{vals: map[string]any{}}
	for {
		p.skipSpace()
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			return d, nil
		}
		if p.i >= len(p.s) {
			return nil, p.errorf("unterminated dict")
		}
		if p.s[p.i] != '\'' && p.s[p.i] != '"' {
			return nil, p.errorf("dict keys must be strings, found %q", p.rest())
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if _, dup := d.vals[k]; dup {
			return nil, p.errorf("duplicate key %q", k)
		}
		p.skipSpace()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, p.errorf("want ':' after key %q", k)
		}
		p.i++
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals[k] = v
		p.skipSpace()
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == '}' {
			continue
		}
		return nil, p.errorf("want ',' or '}' after the value of %q", k)
	}
}

func (p *pyParser) str() (string, error) {
	q := p.s[p.i]
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch c {
		case q:
			return b.String(), nil
		case '\\':
			if p.i >= len(p.s) {
				return "", p.errorf("unterminated string")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case '\n':
			return "", p.errorf("newline inside a string")
		default:
			b.WriteByte(c)
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *pyParser) integer() (any, error) {
	start := p.i
	if p.s[p.i] == '-' || p.s[p.i] == '+' {
		p.i++
	}
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	text := string(p.s[start:p.i])
	// Python 2 era files wrote shapes as (3L, 4L).
	if p.i < len(p.s) && (p.s[p.i] == 'L' || p.s[p.i] == 'l') {
		p.i++
	}
	if p.i < len(p.s) && (isIdentByte(p.s[p.i]) || p.s[p.i] == '.') {
		p.i = start
		return nil, p.errorf("%q is not an int", p.rest())
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		p.i = start
		return nil, p.errorf("%q is not a 64-bit int", text)
	}
	return v, nil
}

func pyTypeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a bool"
	case int64:
		return "an int"
	case pyTuple:
		return "a tuple"
	case pyList:
		return "a list"
	case pyDict:
		return "a dict"
	case pyNone:
		return "None"
	}
	return fmt.Sprintf("%T", v)
}
