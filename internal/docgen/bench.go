package docgen

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// BenchResults is the committed output of the last `make bench`, in Go's
// benchmark format with the machine, the date and the load average as
// configuration lines; the benchmarks page is generated from it.
const BenchResults = "bench/results.txt"

// benchRun is what one `make bench` recorded.
type benchRun struct {
	// config holds the configuration lines by key, the first of each
	// (date, machine, load-average, cpu, go, ...).
	config map[string]string
	// pkgs are the packages in the order they ran; benches their
	// benchmarks by package, in the order they first appear.
	pkgs    []string
	benches map[string][]*bench
	// skipped are the benchmarks that skipped, with the reason they
	// logged, by package.
	skipped map[string][][2]string
}

// A bench is one benchmark, its sub-benchmarks ("cases") and the values
// each reported, by unit, over the runs.
type bench struct {
	name  string
	cases []string
	units []string
	vals  map[string]map[string][]float64 // case → unit → one value per run
}

var (
	configLine = regexp.MustCompile(`^([a-z][^\s:]*):\s*(.*)$`)
	// the GOMAXPROCS suffix Go appends to a benchmark's name
	procsSuffix = regexp.MustCompile(`-\d+$`)
	skipLine    = regexp.MustCompile(`^\s*--- SKIP: (Benchmark\S+)`)
)

// parseBench reads Go benchmark output.
func parseBench(data []byte) (*benchRun, error) {
	r := &benchRun{config: map[string]string{}, benches: map[string][]*bench{}, skipped: map[string][][2]string{}}
	pkg := ""
	var skipping string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := skipLine.FindStringSubmatch(line); m != nil {
			skipping = m[1]
			r.skipped[pkg] = append(r.skipped[pkg], [2]string{skipping, ""})
			continue
		}
		if skipping != "" && strings.HasPrefix(line, "    ") {
			// the reason the skipped benchmark logged: file.go:N: text
			s := r.skipped[pkg]
			reason := strings.TrimSpace(line)
			if i := strings.Index(reason, ": "); i >= 0 && strings.Contains(reason[:i], ".go:") {
				reason = reason[i+2:]
			}
			if s[len(s)-1][1] == "" {
				s[len(s)-1][1] = reason
			}
			continue
		}
		skipping = ""
		if m := configLine.FindStringSubmatch(line); m != nil {
			if m[1] == "pkg" {
				pkg = m[2]
				if !slices.Contains(r.pkgs, pkg) {
					r.pkgs = append(r.pkgs, pkg)
				}
			} else if _, ok := r.config[m[1]]; !ok {
				r.config[m[1]] = m[2]
			}
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f)%2 != 0 {
			continue // a benchmark's name printed before its log lines
		}
		if pkg == "" {
			return nil, fmt.Errorf("%s:%d: a result before any pkg: line", BenchResults, n)
		}
		full := procsSuffix.ReplaceAllString(f[0], "")
		name, cs, _ := strings.Cut(full, "/")
		var b *bench
		for _, x := range r.benches[pkg] {
			if x.name == name {
				b = x
			}
		}
		if b == nil {
			b = &bench{name: name, vals: map[string]map[string][]float64{}}
			r.benches[pkg] = append(r.benches[pkg], b)
		}
		if _, ok := b.vals[cs]; !ok {
			b.cases = append(b.cases, cs)
			b.vals[cs] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: value %q: %w", BenchResults, n, f[i], err)
			}
			unit := f[i+1]
			if !slices.Contains(b.units, unit) {
				b.units = append(b.units, unit)
			}
			b.vals[cs][unit] = append(b.vals[cs][unit], v)
		}
	}
	return r, sc.Err()
}

// benchDocs reads the doc comments of the Benchmark functions of the
// packages a run names (their _test.go files), by package and name.
func benchDocs(pkgs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, pkg := range pkgs {
		dir := strings.TrimPrefix(pkg, "fp16audit/")
		names, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			f, err := parser.ParseFile(token.NewFileSet(), n, nil, parser.ParseComments)
			if err != nil {
				return nil, err
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Benchmark") && fd.Doc != nil {
					out[pkg+"."+fd.Name.Name] = flat(fd.Doc.Text())
				}
			}
		}
	}
	return out, nil
}

// docNames are the Benchmark functions of pkg that have a doc comment,
// sorted.
func docNames(docs map[string]string, pkg string) []string {
	var out []string
	for k := range docs {
		if name, ok := strings.CutPrefix(k, pkg+"."); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// ratio reports whether a unit is a ratio of two measurements (audit/3plain,
// rss-bounded/budget) rather than a quantity per operation (ms/audit,
// MB-rss-plain, GB/s).
func ratio(unit string) bool {
	num, _, ok := strings.Cut(unit, "/")
	if !ok {
		return false
	}
	for _, q := range []string{"ns", "ms", "cpu-ms", "MB", "GB", "B", "bytes", "runs", "allocs"} {
		if num == q || strings.HasPrefix(num, q+"-") {
			return false
		}
	}
	return true
}

// benchValue formats a unit's values over the runs: one value, or the
// range.
func benchValue(unit string, vs []float64) string {
	if len(vs) == 0 {
		return ""
	}
	lo, hi := slices.Min(vs), slices.Max(vs)
	f := func(v float64) string {
		if unit == "ns/op" {
			return time.Duration(v).Round(time.Duration(math.Pow(10, math.Max(0, math.Floor(math.Log10(v))-2)))).String()
		}
		if a := math.Abs(v); a >= 1000 && a < 1e7 {
			return strconv.FormatFloat(v, 'f', 0, 64)
		}
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	if f(lo) == f(hi) {
		return f(lo)
	}
	return f(lo) + "–" + f(hi)
}

// caseName is a sub-benchmark's name in a table cell ("—" for a
// benchmark without).
func caseName(cs string) string {
	if cs == "" {
		return "—"
	}
	return cell(cs)
}

// orUnknown is s, or "unknown" where the results do not say.
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// benchPage writes the benchmarks page from BenchResults: the machine,
// the date and the load, the ratios in short (a snippet section the
// performance page includes), then every benchmark with its doc comment
// and what it reported.
func benchPage(files Files) error {
	const page = Dir + "/benchmarks.md"
	data, err := os.ReadFile(BenchResults)
	if os.IsNotExist(err) {
		files[page] = []byte("# Benchmarks\n\nNo benchmark results are committed yet: `make bench` writes `" + BenchResults + "`, and `make docs-gen` this page from it.\n")
		return nil
	}
	if err != nil {
		return err
	}
	r, err := parseBench(data)
	if err != nil {
		return err
	}
	docs, err := benchDocs(r.pkgs)
	if err != nil {
		return err
	}
	c := r.config
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	fmt.Fprintf(&b, "What the last `make bench` measured, generated from `%s`, which it writes (Go's benchmark format: `benchstat` reads it). "+
		"[Performance](../performance.md) says what each benchmark measures and what stands between each figure and its floor.\n\n", BenchResults)
	b.WriteString("| | |\n|---|---|\n")
	for _, kv := range [][2]string{
		{"date", c["date"]}, {"machine", c["machine"]}, {"cpu", c["cpu"]},
		{"load average (1, 5, 15 min) before", c["load-average"]}, {"load average after", c["load-average-after"]},
		{"Go", c["go"]}, {"ONNX Runtime", c["onnxruntime"]}, {"runs of each benchmark", c["bench-count"]},
	} {
		if kv[1] != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", kv[0], cell(kv[1]))
		}
	}
	b.WriteString("\nA time moves with the machine's load, and on a machine others share so does a ratio: compare ratios measured in the same run (the audit against plain ONNX Runtime on the same models and batches), and numbers from a quiet machine. With several runs a cell gives the range.\n\n")
	b.WriteString("<!-- --8<-- [start:summary] -->\n")
	fmt.Fprintf(&b, "Measured by `make bench` on %s (%s; load average %s before, %s after; %s run(s) of each):\n\n",
		orUnknown(c["date"]), orUnknown(c["machine"]), orUnknown(c["load-average"]), orUnknown(c["load-average-after"]), orUnknown(c["bench-count"]))
	b.WriteString("| benchmark | case | ratio | value |\n|---|---|---|---|\n")
	for _, pkg := range r.pkgs {
		for _, x := range r.benches[pkg] {
			for _, cs := range x.cases {
				for _, u := range x.units {
					if vs := x.vals[cs][u]; ratio(u) && len(vs) > 0 {
						// no link: the performance page includes this table
						fmt.Fprintf(&b, "| %s | %s | `%s` | %s |\n", x.name, caseName(cs), u, benchValue(u, vs))
					}
				}
			}
		}
	}
	var missing []string
	for _, pkg := range r.pkgs {
		for _, s := range r.skipped[pkg] {
			missing = append(missing, fmt.Sprintf("`%s` (skipped: %s)", s[0], strings.TrimSuffix(s[1], ".")))
		}
		for _, name := range docNames(docs, pkg) {
			ran := slices.ContainsFunc(r.benches[pkg], func(x *bench) bool { return x.name == name }) ||
				slices.ContainsFunc(r.skipped[pkg], func(s [2]string) bool { return s[0] == name })
			if !ran {
				missing = append(missing, "`"+name+"`")
			}
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(&b, "\nNot measured in this run, though their packages were: %s.\n", strings.Join(missing, ", "))
	}
	b.WriteString("<!-- --8<-- [end:summary] -->\n")
	for _, pkg := range r.pkgs {
		fmt.Fprintf(&b, "\n## `%s`\n", strings.TrimPrefix(pkg, "fp16audit/"))
		for _, x := range r.benches[pkg] {
			fmt.Fprintf(&b, "\n### %s\n\n", x.name)
			if d := docs[pkg+"."+x.name]; d != "" {
				fmt.Fprintf(&b, "%s\n\n", d)
			}
			b.WriteString("| case |")
			for _, u := range x.units {
				if u == "ns/op" {
					u = "time/op"
				}
				fmt.Fprintf(&b, " %s |", cell(u))
			}
			b.WriteString("\n|---|" + strings.Repeat("---|", len(x.units)) + "\n")
			for _, cs := range x.cases {
				fmt.Fprintf(&b, "| %s |", caseName(cs))
				for _, u := range x.units {
					fmt.Fprintf(&b, " %s |", benchValue(u, x.vals[cs][u]))
				}
				b.WriteString("\n")
			}
		}
	}
	files[page] = []byte(b.String())
	return nil
}
