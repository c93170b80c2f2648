package markup

import "strings"

// escaper escapes what Markdown would read as markup.
var escaper = strings.NewReplacer(`\`, `\\`, "|", `\|`, "<", "&lt;", ">", "&gt;", "*", `\*`, "_", `\_`, "`", "\\`", "[", `\[`, "]", `\]`, "\n", " ")

// MDText escapes s for a Markdown table cell or paragraph.
func MDText(s string) string { return escaper.Replace(s) }

// MDCode writes s as a code span; inside a table a pipe still needs its
// backslash.
func MDCode(s string) string {
	if s == "" {
		return ""
	}
	if strings.Contains(s, "`") {
		return MDText(s)
	}
	return "`" + strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ") + "`"
}

// MDCodeList writes names as code spans separated by commas, "none" when
// there are none.
func MDCodeList(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = MDCode(x)
	}
	return strings.Join(parts, ", ")
}
