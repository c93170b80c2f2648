package statsop_test

import (
	"errors"
	"strings"
	"testing"

	"fp16audit/fixtures"
	"fp16audit/internal/onnx"
	"fp16audit/internal/ortcapi"
	"fp16audit/internal/statsop"
	"fp16audit/internal/tensor"
)

// TestObserveOutOfMemory: a failed allocation of the statistics kernels is
// an error, and the next call works.
func TestObserveOutOfMemory(t *testing.T) {
	x := []float32{1, -2, 3}
	for k := 1; k <= 5; k++ {
		statsop.FailAllocs(k)
		_, err := statsop.ObserveRecords(0, x, x)
		statsop.FailAllocs(0)
		if err == nil || !strings.Contains(err.Error(), "out of memory") {
			t.Errorf("allocation %d failing: %v, want an out-of-memory error", k, err)
		}
	}
	recs, err := statsop.ObserveRecords(0, x, x)
	if err != nil || len(recs) != 2 || recs[0].Stats(0).Count != 3 {
		t.Fatalf("after the failures: %v, %v", recs, err)
	}
}

// TestSessionOutOfMemory: whichever allocation of the operators fails —
// the record buffer, a kernel while ONNX Runtime creates the session, a
// kernel's work space while it runs — the audit's session reports out of
// memory instead of crashing, and the same passes run afterwards agree
// with a run that never failed.
func TestSessionOutOfMemory(t *testing.T) {
	rt := runtimes(t)
	f := fixtures.All()[0]
	data, err := onnx.Marshal(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnx.LoadBytes(data, f.Name+".onnx")
	if err != nil {
		t.Fatal(err)
	}
	ap := newAuditPasses(t, m)
	var inputs []string
	for _, x := range f.Batches[0].Inputs {
		inputs = append(inputs, x.Name)
	}
	in := [][]*tensor.Tensor{f.Batches[0].Inputs}
	want := opResults(t, rt, ap, inputs, in, ortcapi.LevelNone, chunkLen)
	plan, err := statsop.Combine(ap.passes, ap.names, ap.elemType, chunkLen)
	if err != nil {
		t.Fatal(err)
	}
	kernels := 0
	for _, n := range plan.Model.Graph.Node {
		if n.Domain == statsop.Domain {
			kernels++
		}
	}
	// The record buffer, every kernel, then the first Observe's work.
	for k := 1; k <= kernels+3; k++ {
		statsop.FailAllocs(k)
		_, err := opResultsErr(rt, ap, inputs, in, ortcapi.LevelNone, chunkLen)
		statsop.FailAllocs(0)
		t.Logf("allocation %d failing: %v", k, err)
		if err == nil || !strings.Contains(err.Error(), "out of memory") {
			t.Fatalf("allocation %d of %d kernels failing: %v, want an out-of-memory error", k, kernels, err)
		}
	}
	got := opResults(t, rt, ap, inputs, in, ortcapi.LevelNone, chunkLen)
	for _, b := range compareResults(ap, got, want) {
		t.Error(b)
	}
}

// TestRegisterRetries: a failure to create the operators' domain is
// returned, and not kept: the next Register succeeds.
func TestRegisterRetries(t *testing.T) {
	rt := runtimes(t)
	want := statsop.FailRegisterOnce()
	if _, err := statsop.Register(rt); !errors.Is(err, want) {
		t.Fatalf("first Register: %v, want %v", err, want)
	}
	d, err := statsop.Register(rt)
	if err != nil || d == nil {
		t.Fatalf("Register after a failure: %v", err)
	}
	if again, err := statsop.Register(rt); err != nil || again != d {
		t.Fatalf("a third Register: %v, %p != %p", err, again, d)
	}
}
