package docgen

import (
	"fmt"
	"regexp"
	"strings"
)

// usageLine finds the commands in `fp16audit --help`'s usage.
var usageLine = regexp.MustCompile(`(?m)^  fp16audit ([a-z][a-z0-9-]*)`)

// commandPage writes the command-line reference: `fp16audit --help`, then
// every command it lists with its own --help.
func commandPage(files Files) error {
	top, _, err := run([]int{0}, "--help")
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# Command line\n\n")
	b.WriteString("`fp16audit` is one executable with a command per job. This page is each command's `--help`, " +
		"as the binary prints it. Exit codes: 0 clean, 1 findings at the `--fail-on` level, 2 a usage error or an input fp16audit cannot read, 3 an internal error.\n\n")
	b.WriteString(fence("text", "$ fp16audit --help\n"+top))
	var names []string
	for _, m := range usageLine.FindAllStringSubmatch(top, -1) {
		if m[1] != "help" {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("fp16audit --help lists no commands")
	}
	for _, n := range names {
		help, _, err := run([]int{0}, n, "--help")
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "\n## fp16audit %s\n\n", n)
		b.WriteString(fence("text", "$ fp16audit "+n+" --help\n"+help))
	}
	files[Dir+"/cli.md"] = []byte(b.String())
	return nil
}
