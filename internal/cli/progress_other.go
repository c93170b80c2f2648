//go:build !unix

package cli

import "os"

// ttyWidth is unknown here; $COLUMNS is the only source.
func ttyWidth(*os.File) int { return 0 }
