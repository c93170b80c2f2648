// Command fp16audit audits an exported ONNX model for fp16 mixed-precision
// failures. See README.md for the subcommands, flags and exit codes.
package main

import "os"

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}
