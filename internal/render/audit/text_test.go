package audit

import (
	"testing"
)

func TestShorten(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"/conv1/Conv", 20, "/conv1/Conv"},
		{"/layer1/layer1.0/bn1/BatchNormalization", 20, "/layer1/l…malization"},
		{"abcdef", 5, "ab…ef"},
	} {
		if got := shorten(c.in, c.max); got != c.want || runeLen(got) > c.max {
			t.Errorf("shorten(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func TestWrap(t *testing.T) {
	got := wrap("one two three four five six", 14, 2, 4)
	want := "one two\n    three four\n    five six"
	if got != want {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}
