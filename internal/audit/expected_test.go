package audit_test

import (
	"context"
	"flag"
	"fmt"
	"fp16audit/internal/golden"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/audit"
	"fp16audit/report"
)

var update = flag.Bool("update", false, "rewrite the expected-findings files")

// expectedCase is one audit whose findings have an expected-findings file.
type expectedCase struct {
	name   string // the file's name without extension
	dir    string // where the file lives
	model  string
	inputs []string
	policy string
}

// expectedCases lists every fixture: the Go-built ones with each of their
// batches (autocast-fp16), the torch exports of fixtures/models, and every
// real torch case under each policy its truth covers (files beside the
// case, in expected/).
func expectedCases(t *testing.T) []expectedCase {
	var out []expectedCase
	goDir := filepath.Join(fixtureDir, "expected")
	for _, f := range fixtures.All() {
		for _, b := range f.Batches {
			out = append(out, expectedCase{name: f.Name + "__" + b.Name, dir: goDir,
				model: filepath.Join(fixtureDir, "models", f.Name+".onnx"), inputs: []string{batchPath(b.Name + ".npy")}, policy: "autocast-fp16"})
		}
	}
	for _, te := range fixtures.TorchExports() {
		name := strings.TrimSuffix(filepath.Base(te.Model), ".onnx")
		out = append(out, expectedCase{name: name, dir: goDir, model: filepath.Join(fixtureDir, "models", filepath.Base(te.Model)),
			inputs: []string{batchPath(filepath.Base(te.Batch))}, policy: "autocast-fp16"})
	}
	dirs, err := filepath.Glob(filepath.Join(torchCases, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		tr := readTruth(t, dir)
		inputs := []string{filepath.Join(dir, "batches")}
		if tr.Case == "degenerate_batches" {
			inputs = []string{filepath.Join(dir, "batches", "constant.npy")}
		}
		for _, p := range []string{"autocast-fp16", "half", "autocast-bf16"} {
			if _, ok := tr.Policies[p]; ok {
				out = append(out, expectedCase{name: p, dir: filepath.Join(dir, "expected"), model: filepath.Join(dir, "model.onnx"), inputs: inputs, policy: p})
			}
		}
	}
	return out
}

// TestExpectedFindings compares, analysistest-style, everything an audit
// concludes — verdict, origins, verified fixes and every finding with its
// check, severity, node and value — with the expected-findings file beside
// each fixture. An extra or a missing line fails; `go test ./internal/audit
// -run TestExpectedFindings -update` rewrites the files, and the diff is
// the review.
func TestExpectedFindings(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, c := range expectedCases(t) {
		t.Run(filepath.Base(c.dir)+"/"+c.name, func(t *testing.T) {
			r, err := audit.Run(context.Background(), audit.Config{ModelPath: c.model, Inputs: c.inputs, Policy: c.policy, Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			got := expectedText(r)
			golden.Check(t, filepath.Join(c.dir, c.name+".findings"), got, *update, "go test ./internal/audit -run TestExpectedFindings -update")
		})
	}
}

// expectedText is the stable, reviewable summary of an audit's
// conclusions: one line each, in the report's order.
func expectedText(r *report.Report) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "policy %s\nverdict %s\n", r.Policy, r.Verdict)
	for _, o := range r.Origins {
		where := o.Node
		if o.Input != "" {
			where = "input " + o.Input
		}
		fmt.Fprintf(&b, "origin %s pass=%s cause=%s op=%s module=%s precision=%s", where, o.Pass, o.Cause, o.OpType, o.Module, o.Precision)
		if o.Provenance != nil {
			fmt.Fprintf(&b, " why=%s", strings.Join(o.Provenance.Reasons, "+"))
			if len(o.Provenance.Casts) > 0 {
				fmt.Fprintf(&b, " casts=%s", strings.Join(o.Provenance.Casts, ","))
			}
		}
		if o.Constant != "" {
			fmt.Fprintf(&b, " constant=%s", o.Constant)
		}
		fmt.Fprintf(&b, " outputs=%s", strings.Join(o.AffectedOutputs, ","))
		if len(o.WrongOutputs) > 0 {
			fmt.Fprintf(&b, " wrong=%s", strings.Join(o.WrongOutputs, ","))
		}
		b.WriteString("\n")
	}
	for _, f := range r.Fixes {
		fmt.Fprintf(&b, "fix %s works=%v", f.Kind, f.Works)
		if len(f.Inputs) > 0 {
			fmt.Fprintf(&b, " inputs=%s", strings.Join(f.Inputs, ","))
		}
		if len(f.Modules) > 0 {
			fmt.Fprintf(&b, " modules=%s", strings.Join(f.Modules, ","))
		} else if len(f.Nodes) > 0 {
			fmt.Fprintf(&b, " nodes=%s", strings.Join(f.Nodes, ","))
		}
		b.WriteString("\n")
	}
	var lines []string
	for _, f := range r.Findings {
		l := fmt.Sprintf("finding %s %s", f.Check, f.Severity)
		if f.Node != "" {
			l += " node=" + f.Node
		}
		if f.Value != "" {
			l += " value=" + f.Value
		}
		if f.Pass != "" {
			l += " pass=" + f.Pass
		}
		lines = append(lines, l)
	}
	// Findings keep their analyzers' order; within one check the order is
	// the graph's, which a rewrite may legitimately change.
	sort.SliceStable(lines, func(i, j int) bool { return lines[i][:14] < lines[j][:14] })
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return []byte(b.String())
}
