// Command fp16audit audits an exported ONNX model for fp16 mixed-precision
// failures. See README.md for the subcommands, flags and exit codes; the
// commands themselves live in internal/cli.
package main

import (
	"os"

	"fp16audit/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
