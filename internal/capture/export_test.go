package capture

// SetHashInline sets the size above which Start hashes a file later, and
// returns the function that restores it.
func SetHashInline(n int64) func() {
	old := hashInline
	hashInline = n
	return func() { hashInline = old }
}
