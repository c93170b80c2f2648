package grad

// Reading holds the values of one gradient's Summary outputs after one
// run of the backward graph.
type Reading struct {
	// MaxAbs is max |gradient| before rounding (NaN or Inf when the
	// gradient already held NaN or Inf before rounding).
	MaxAbs float64
	// NonFinite is set when the gradient after rounding holds Inf or NaN.
	NonFinite bool
	// NonZero and Flushed count the elements nonzero before rounding and,
	// among them, those rounding made zero.
	NonZero, Flushed float64
}

// FlushedFraction is Flushed / NonZero, 0 for a gradient without nonzero
// elements.
func (r Reading) FlushedFraction() float64 {
	if r.NonZero == 0 {
		return 0
	}
	return r.Flushed / r.NonZero
}

// Scan is one run of a backward graph built with Options.Summaries at one
// loss scale: the loss and the Reading of every gradient and Site.
type Scan struct {
	// Exp is the loss scale's exponent: the run used scale 2^Exp.
	Exp int
	// Loss is the unscaled loss.
	Loss float64
	// Grads maps Grad.Value to the reading of its gradient, and Sites
	// maps Site.Rounded to the reading of the site.
	Grads map[string]Reading
	Sites map[string]Reading
}

// SummaryOutputs lists the graph outputs a Scan reads: the loss and every
// Summary output of res, which must have been built with Summaries.
func (r *Result) SummaryOutputs() []string {
	out := []string{r.Loss}
	add := func(s *Summary) {
		if s == nil {
			return
		}
		out = append(out, s.MaxAbs, s.NonFinite, s.NonZero)
		if s.Flushed != "" {
			out = append(out, s.Flushed)
		}
	}
	for _, g := range r.Grads {
		add(g.Summary)
	}
	for _, s := range r.Sites {
		add(s.Summary)
	}
	return out
}
