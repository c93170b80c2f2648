package onnxrt

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"fp16audit/internal/onnx"
	"fp16audit/internal/tensor"
)

// TestStopOnEndsRunInFlight: a run of a thousand large MatMuls (tens of
// seconds) stops soon after its context is cancelled, with the context's
// error, and later runs of the session fail at once.
func TestStopOnEndsRunInFlight(t *testing.T) {
	const n, size = 1000, 512
	w := make([]float32, size*size)
	for i := range w {
		w[i] = float32(i%7-3) / size
	}
	g := &onnx.GraphProto{Name: "chain",
		Initializer: []*onnx.TensorProto{onnx.FloatTensor("W", []int64{size, size}, w)},
		Input:       []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, size, size)},
		Output:      []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, size, size)},
	}
	prev := "x"
	for i := range n {
		out := fmt.Sprintf("h%d", i)
		if i == n-1 {
			out = "y"
		}
		g.Node = append(g.Node, onnx.Node("MatMul", fmt.Sprintf("mm%d", i), []string{prev, "W"}, []string{out}))
		prev = out
	}
	s := newSession(t, marshal(t, g), []string{"x"}, []string{"y"}, SessionOptions{Threads: 1})
	x := tensor.FromFloat32s("x", []int64{size, size}, make([]float32, size*size))
	ctx, cancel := context.WithCancel(context.Background())
	defer s.StopOn(ctx)()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := s.Run([]*tensor.Tensor{x})
		done <- err
	}()
	// Let the run get going: the cancellation must reach a run in flight.
	time.Sleep(200 * time.Millisecond)
	cancel()
	err := <-done
	t.Logf("stopped after %v: %v", time.Since(start), err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run after cancel: %v, want an error wrapping context.Canceled", err)
	}
	if _, err := s.Run([]*tensor.Tensor{x}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a later run of the stopped session: %v, want context.Canceled", err)
	}
}

// TestStopOnEnded: a context that has already ended stops the very next
// run, every time.
func TestStopOnEnded(t *testing.T) {
	g := &onnx.GraphProto{Name: "neg",
		Input:  []*onnx.ValueInfoProto{onnx.TensorValueInfo("x", onnx.TensorProto_FLOAT, 2)},
		Output: []*onnx.ValueInfoProto{onnx.TensorValueInfo("y", onnx.TensorProto_FLOAT, 2)},
		Node:   []*onnx.NodeProto{onnx.Node("Neg", "neg", []string{"x"}, []string{"y"})},
	}
	x := tensor.FromFloat32s("x", []int64{2}, []float32{1, 2})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 50 {
		s := newSession(t, marshal(t, g), []string{"x"}, []string{"y"}, SessionOptions{Threads: 1})
		s.StopOn(ctx)
		if _, err := s.Run([]*tensor.Tensor{x}); !errors.Is(err, context.Canceled) {
			t.Fatalf("session %d: run after StopOn of an ended context: %v, want context.Canceled", i, err)
		}
	}
}
