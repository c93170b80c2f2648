package logfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"fp16audit/report"
)

// bareMark marks a NaN/Infinity token that was bare in the input, so that a
// string "NaN" in the scales can still be told apart from a bare NaN.
const bareMark = "\x00"

// quoteNonFinite turns the bare tokens NaN, Infinity and -Infinity that
// Python's json module writes (and encoding/json rejects) into marked
// strings, leaving string contents alone.
func quoteNonFinite(data []byte) []byte {
	var out []byte
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			out = append(out, c)
			continue
		}
		if c == '"' {
			inString = true
			out = append(out, c)
			continue
		}
		matched := false
		for _, tok := range []string{"NaN", "Infinity", "-Infinity"} {
			if bytes.HasPrefix(data[i:], []byte(tok)) {
				out = append(out, `"\u0000`+tok+`"`...)
				i += len(tok) - 1
				matched = true
				break
			}
		}
		if !matched {
			out = append(out, c)
		}
	}
	return out
}

func lineAt(data []byte, offset int64) int {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	return bytes.Count(data[:offset], []byte{'\n'}) + 1
}

// jsonNumbers decodes an array of numbers. Losses accept null and the
// non-finite words; scales accept only numbers.
func jsonNumbers(raw json.RawMessage, field string, loss bool) ([]float64, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, fmt.Errorf("%s: want an array of numbers, found %s", field, describeJSON(raw))
	}
	out := make([]float64, len(elems))
	for i, e := range elems {
		v, err := jsonFloat(e, loss)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %v", field, i, err)
		}
		out[i] = v
	}
	return out, nil
}

func jsonFloat(e json.RawMessage, loss bool) (float64, error) {
	s := string(bytes.TrimSpace(e))
	switch {
	case s == "null":
		if loss {
			return math.NaN(), nil
		}
		return 0, errors.New("want a number, found null")
	case strings.HasPrefix(s, `"`):
		var str string
		if err := json.Unmarshal(e, &str); err != nil {
			return 0, fmt.Errorf("want a number, found %s", s)
		}
		bare := strings.HasPrefix(str, bareMark)
		word := strings.TrimPrefix(str, bareMark)
		if loss {
			if v, ok := nonFiniteWord(word); ok {
				return v, nil
			}
		}
		if bare {
			return 0, fmt.Errorf("want a positive finite number, found %s", word)
		}
		return 0, fmt.Errorf("want a number, found string %q", str)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("want a number, found %s", describeJSON(e))
	}
	return v, nil
}

func nonFiniteWord(s string) (float64, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "nan", "-nan":
		return math.NaN(), true
	case "inf", "+inf", "infinity", "+infinity":
		return math.Inf(1), true
	case "-inf", "-infinity":
		return math.Inf(-1), true
	}
	return 0, false
}

func describeJSON(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	kind := "a value"
	switch {
	case s == "":
		return "nothing"
	case s[0] == '{':
		kind = "an object"
	case s[0] == '[':
		kind = "an array"
	case s[0] == '"':
		kind = "a string"
	case s == "true" || s == "false":
		kind = "a boolean"
	}
	s = strings.ReplaceAll(s, `\u0000`, "")
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return kind + " " + s
}

func jsonInt(raw json.RawMessage) (int, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	if err != nil || v != math.Trunc(v) || math.Abs(v) > 1<<53 {
		return 0, fmt.Errorf("want an integer, found %s", describeJSON(raw))
	}
	return int(v), nil
}

func jsonScaler(raw json.RawMessage) (report.ScalerConfig, error) {
	var m map[string]json.RawMessage
	var c report.ScalerConfig
	if err := json.Unmarshal(raw, &m); err != nil {
		return c, fmt.Errorf("want an object, found %s", describeJSON(raw))
	}
	pos := func(key string, dst *float64) error {
		r, ok := m[key]
		if !ok || string(r) == "null" {
			return nil
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(r)), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%s: want a positive number, found %s", key, describeJSON(r))
		}
		*dst = v
		return nil
	}
	if err := pos("init_scale", &c.InitScale); err != nil {
		return c, err
	}
	if err := pos("growth_factor", &c.GrowthFactor); err != nil {
		return c, err
	}
	if err := pos("backoff_factor", &c.BackoffFactor); err != nil {
		return c, err
	}
	if r, ok := m["growth_interval"]; ok && string(r) != "null" {
		v, err := jsonInt(r)
		if err != nil || v <= 0 {
			return c, fmt.Errorf("growth_interval: want a positive integer, found %s", describeJSON(r))
		}
		c.GrowthInterval = v
	}
	if c.GrowthFactor != 0 && c.GrowthFactor <= 1 {
		return c, fmt.Errorf("growth_factor: want a number above 1, found %g", c.GrowthFactor)
	}
	if c.BackoffFactor >= 1 {
		return c, fmt.Errorf("backoff_factor: want a number below 1, found %g", c.BackoffFactor)
	}
	return c, nil
}
