package ortcapi

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// headerEnv names a copy of onnxruntime_c_api.h to check abi.h against;
// by default the test uses the one github.com/yalue/onnxruntime_go ships.
const headerEnv = "ORTCAPI_HEADER"

func referenceHeader(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(headerEnv); p != "" {
		return p
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/yalue/onnxruntime_go").Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Fatalf("cannot find onnxruntime_go in the module cache (%v); run `go mod download` or set %s to onnxruntime_c_api.h", err, headerEnv)
	}
	return filepath.Join(dir, "onnxruntime_c_api.h")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	lineComment  = regexp.MustCompile(`//[^\n]*`)
)

// members splits the body of `struct name {...};` (or of `typedef struct
// name {...} name;`) in src into its member declarations, comments
// removed and white space collapsed.
func members(t *testing.T, src, name string) []string {
	t.Helper()
	start := strings.Index(src, "struct "+name+" {")
	if start < 0 {
		t.Fatalf("no struct %s", name)
	}
	body := src[start+len("struct "+name+" {"):]
	body = body[:structEnd.FindStringIndex(body)[0]]
	body = lineComment.ReplaceAllString(blockComment.ReplaceAllString(body, ""), "")
	var out []string
	depth, cur := 0, strings.Builder{}
	for _, c := range body {
		cur.WriteRune(c)
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ';':
			if depth == 0 {
				m := strings.Join(strings.Fields(cur.String()), " ")
				out = append(out, strings.TrimSpace(strings.TrimSuffix(m, ";")))
				cur.Reset()
			}
		}
	}
	return out
}

var structEnd = regexp.MustCompile(`\n}\s*(\w+\s*)?;`)

var (
	statusEntry  = regexp.MustCompile(`^ORT_API2_STATUS\((\w+),?(.*)\)`)
	releaseEntry = regexp.MustCompile(`^ORT_CLASS_RELEASE\((\w+)\)`)
	typedEntry   = regexp.MustCompile(`^ORT_API_T\([^,]+,\s*(\w+)(.*)\)`)
	pointerEntry = regexp.MustCompile(`\(\s*(?:ORT_API_CALL\s*)?\*\s*(\w+)\s*\)\s*\((.*)\)`)
)

// entry is one function of the header's OrtApi table.
type entry struct {
	pos    int
	status bool // returns OrtStatus*
	params int
}

// apiTable parses OrtApi into its entries by name.
func apiTable(t *testing.T, src string) map[string]entry {
	t.Helper()
	table := map[string]entry{}
	for i, m := range members(t, src, "OrtApi") {
		var name string
		e := entry{pos: i}
		if g := statusEntry.FindStringSubmatch(m); g != nil {
			name, e.status, e.params = g[1], true, countParams(g[2])
		} else if g := releaseEntry.FindStringSubmatch(m); g != nil {
			name, e.params = "Release"+g[1], 1
		} else if g := typedEntry.FindStringSubmatch(m); g != nil {
			name, e.params = g[1], countParams(strings.TrimPrefix(g[2], ","))
		} else if g := pointerEntry.FindStringSubmatch(m); g != nil {
			name, e.status, e.params = g[1], strings.HasPrefix(m, "OrtStatus"), countParams(g[2])
		} else {
			t.Fatalf("OrtApi member %d not understood: %s", i, m)
		}
		table[name] = e
	}
	return table
}

// countParams counts the top-level comma-separated parameters of a
// parameter list ("void" and "" are none).
func countParams(s string) int {
	s = strings.TrimSpace(s)
	if s == "" || s == "void" {
		return 0
	}
	n, depth := 1, 0
	for _, c := range s {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				n++
			}
		}
	}
	return n
}

// TestFunctionTable checks every position abi.h declares, and the
// parameter count and status return of its function type, against the
// reference header.
func TestFunctionTable(t *testing.T) {
	table := apiTable(t, readFile(t, referenceHeader(t)))
	if len(table) < 300 {
		t.Fatalf("parsed only %d OrtApi entries; the parser no longer understands the header", len(table))
	}
	abi := readFile(t, "abi.h")
	positions := regexp.MustCompile(`(?m)^\s*ortc_(\w+) = (\d+),`).FindAllStringSubmatch(abi, -1)
	fnTypes := map[string]string{}
	flat := strings.Join(strings.Fields(lineComment.ReplaceAllString(blockComment.ReplaceAllString(abi, ""), "")), " ")
	for _, g := range regexp.MustCompile(`typedef ([^;]+?)\(\*ortc_(\w+)_fn\)\(([^;]*)\);`).FindAllStringSubmatch(flat, -1) {
		fnTypes[g[2]] = g[1] + "|" + g[3]
	}
	seen := 0
	for _, g := range positions {
		name := g[1]
		pos, _ := strconv.Atoi(g[2])
		e, ok := table[name]
		if !ok {
			continue // an enum value, not a table position
		}
		seen++
		if e.pos != pos {
			t.Errorf("%s: abi.h says position %d, the header %d", name, pos, e.pos)
		}
		ft, ok := fnTypes[name]
		if !ok {
			if !strings.HasPrefix(name, "Release") {
				t.Errorf("%s: abi.h declares no function type ortc_%s_fn", name, name)
			}
			continue
		}
		ret, params, _ := strings.Cut(ft, "|")
		if got := countParams(params); got != e.params {
			t.Errorf("%s: ortc_%s_fn takes %d parameters, the header's entry %d", name, name, got, e.params)
		}
		if gotStatus := strings.HasPrefix(strings.TrimSpace(ret), "OrtStatus"); gotStatus != e.status {
			t.Errorf("%s: ortc_%s_fn returns %q; the header's entry returns a status: %v", name, name, ret, e.status)
		}
	}
	if seen < 30 {
		t.Fatalf("matched only %d abi.h positions with header entries", seen)
	}
}

// TestAllocatorLayout checks that ortc_allocator lists OrtAllocator's
// fields in the header's order (a uint32 version, then function pointers)
// and ends where version 17, the one it declares, ends.
func TestAllocatorLayout(t *testing.T) {
	got, want := sameFieldOrder(t, "ortc_allocator", "OrtAllocator")
	if len(got) < len(want) && want[len(got)] != "Reserve" {
		t.Errorf("ortc_allocator ends before %s; version 17 allocators end before Reserve (version 18)", want[len(got)])
	}
}

// sameFieldOrder checks that abi.h's struct ours lists the fields of the
// header's struct theirs in the same order, as a prefix, and returns both
// lists of names.
func sameFieldOrder(t *testing.T, ours, theirs string) (got, want []string) {
	t.Helper()
	want = fieldNames(t, members(t, readFile(t, referenceHeader(t)), theirs))
	got = fieldNames(t, members(t, readFile(t, "abi.h"), ours))
	if len(got) > len(want) {
		t.Fatalf("%s has %d fields, the header's %s %d", ours, len(got), theirs, len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("field %d: %s has %s, the header %s", i, ours, got[i], want[i])
		}
	}
	return got, want
}

// fieldNames returns the names of a struct's fields: a uint32 or function
// pointers.
func fieldNames(t *testing.T, ms []string) []string {
	t.Helper()
	field := regexp.MustCompile(`^(?:uint32_t (\w+)|.*\(\s*(?:ORT_API_CALL\s*)?\*\s*(\w+)\s*\)\s*\(.*\)|ORT_API2_STATUS\((\w+),.*\))$`)
	var out []string
	for _, m := range ms {
		g := field.FindStringSubmatch(m)
		if g == nil {
			t.Fatalf("member not understood: %s", m)
		}
		out = append(out, g[1]+g[2]+g[3])
	}
	return out
}

// TestCustomOpLayout checks that ortc_custom_op lists OrtCustomOp's fields
// in the header's order (a uint32 version, then function pointers only, so
// the same order gives the same offsets) up to the last field it declares.
func TestCustomOpLayout(t *testing.T) {
	got, _ := sameFieldOrder(t, "ortc_custom_op", "OrtCustomOp")
	if got[len(got)-1] != "KernelComputeV2" {
		t.Errorf("ortc_custom_op ends at %s; version 16 ops end at KernelComputeV2", got[len(got)-1])
	}
}
