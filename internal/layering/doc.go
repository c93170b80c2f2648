// Package layering holds the test that keeps the tree to the map in
// docs/architecture.md: every package is listed in the doc's stage table
// and every listed package exists; a package imports only what its stage
// may import (the doc's import table); only the packages the doc names use
// cgo, bind ONNX Runtime or open its sessions; and the test-only packages
// are imported only by tests. The tables are read from the doc itself, so
// that the doc and the test cannot drift apart. The package has no code of
// its own.
package layering
