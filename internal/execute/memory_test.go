package execute

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"512M", 512 << 20}, {"4G", 4 << 30}, {"4g", 4 << 30}, {"1.5G", 3 << 29}, {"64KiB", 64 << 10},
		{"2GB", 2 << 30}, {"1T", 1 << 40}, {"1048576", 1 << 20}, {" 8M ", 8 << 20},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "M", "-1G", "0", "12X", "1e30T", "four"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for n, want := range map[int64]string{512: "512 B", 1536: "1.5 KiB", 320 << 20: "320 MiB", 3 << 29: "1.5 GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestAvailableMemory(t *testing.T) {
	n, src, ok := availableMemory()
	if !ok {
		t.Skip("no /proc/meminfo")
	}
	if n <= 0 || src == "" {
		t.Errorf("available %d from %q", n, src)
	}
}

// TestRefuseAboveAvailable: passes that need more than the available
// memory stop with a *BudgetError that names the sizes and --max-memory.
func TestRefuseAboveAvailable(t *testing.T) {
	defer func(f func() (int64, string, bool)) { memAvailable = f }(memAvailable)
	memAvailable = func() (int64, string, bool) { return 4 << 10, "the test", true }
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		t.Fatal(err)
	}
	if err := onnxrt.Init(lib); err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Load(filepath.Join("..", "..", "fixtures", "models", "cnn.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	specs := batch.Specs(m.Proto.Graph, m.Index)
	bs, _, err := batch.Load(specs, batch.Options{Args: []string{filepath.Join("..", "..", "fixtures", "batches", "cnn.npy")}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ni := range m.Index.Order() {
		names = append(names, m.Proto.Graph.Node[ni].Output...)
	}
	e := &Engine{Inputs: batch.Names(specs), Order: m.Index.Order(), Nodes: len(m.Proto.Graph.Node),
		Observe: names, ElemType: m.Index.ElemType, MaxMemory: 1 << 30,
		Session: onnxrt.SessionOptions{ExternalDataDir: m.Dir, Optimization: "none"}}
	_, _, err = e.Run(context.Background(), []Pass{{Name: "fp32", Model: m.Proto}}, bs)
	var be *BudgetError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "--max-memory") || !strings.Contains(err.Error(), "4 KiB") {
		t.Fatalf("got %v, want a budget error naming the 4 KiB available and --max-memory", err)
	}
}
