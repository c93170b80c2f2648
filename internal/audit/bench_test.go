package audit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"fp16audit/fixtures"
	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
	"fp16audit/internal/onnxrt"
	"fp16audit/internal/precision"
	"fp16audit/internal/tensor"
)

// The benchmarks below time fp16audit against plain ONNX Runtime inference
// of the same model and batch, and report the ratios as metrics. "plain" is
// what a user's own inference does: ONNX Runtime's default session (all
// graph optimizations), only the model's outputs. docs/performance.md holds
// a table measured with
//
//	go test -run '^$' -bench . -benchtime 1x ./audit/

var (
	benchOnce     sync.Once
	benchFixtures []*fixtures.Fixture
)

// benchModels are BigMLP and BigCNN (small enough for quick comparisons)
// and the sizes of real models: a 12-layer transformer encoder (d=768,
// sequence 256, batch 4) and ResNet-18 at 224x224 (batch 4).
func benchModels() []*fixtures.Fixture {
	benchOnce.Do(func() {
		benchFixtures = []*fixtures.Fixture{fixtures.BigMLP(), fixtures.BigCNN(),
			fixtures.BigTransformer(12, 768, 256, 4), fixtures.BigResNet(224, 4)}
	})
	return benchFixtures
}

func outputNames(m *onnx.ModelProto) []string {
	var out []string
	for _, o := range m.Graph.Output {
		out = append(out, o.Name)
	}
	return out
}

func initRuntime(b *testing.B) {
	lib, err := onnxrt.FindLibrary("")
	if err != nil {
		b.Fatal(err)
	}
	if err := onnxrt.Init(lib); err != nil {
		b.Fatal(err)
	}
}

// writeFixture saves f's model and first batch under dir.
func writeFixture(b testing.TB, f *fixtures.Fixture, dir string) (model, batchFile string) {
	model = filepath.Join(dir, f.Name+".onnx")
	if err := onnx.Save(f.Model, model); err != nil {
		b.Fatal(err)
	}
	npy, err := batch.EncodeNPY(f.Batches[0].Inputs[0])
	if err != nil {
		b.Fatal(err)
	}
	batchFile = filepath.Join(dir, f.Name+".npy")
	if err := os.WriteFile(batchFile, npy, 0o644); err != nil {
		b.Fatal(err)
	}
	return model, batchFile
}

// plainRun times one plain inference: session creation and one run.
func plainRun(b *testing.B, data []byte, in *tensor.Tensor, outs []string) (create, run time.Duration) {
	t0 := time.Now()
	s, err := onnxrt.NewSession(data, []string{in.Name}, outs, onnxrt.SessionOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	t1 := time.Now()
	if _, err := s.Run([]*tensor.Tensor{in}); err != nil {
		b.Fatal(err)
	}
	return t1.Sub(t0), time.Since(t1)
}

// BenchmarkFullAudit: audit.Run end to end (load, fp32, fp16 and bf16
// passes, statistics, diagnosis; no fix reruns) against three plain
// inferences, each with its session creation (target ≤ 1.25). ms/plain is
// the run alone, without session creation.
func BenchmarkFullAudit(b *testing.B) {
	benchAudit(b, benchModels(), precision.DefaultPolicy, 3)
}

// BenchmarkReferencePass: the fp32 reference pass alone (audit.Run under
// --policy fp32: load, instrumented run, statistics of every value) against
// one plain inference with its session creation (target ≤ 1.3), on the MLP
// and CNN sized so that plain inference takes ≥ 50 ms on 2 cores.
func BenchmarkReferencePass(b *testing.B) {
	benchAudit(b, benchModels()[:2], "fp32", 1)
}

// benchAudit times audit.Run under policy against plain inferences, each
// with its session creation, on every model.
func benchAudit(b *testing.B, models []*fixtures.Fixture, policy string, plain int) {
	initRuntime(b)
	for _, f := range models {
		b.Run(f.Name, func(b *testing.B) {
			modelPath, batchPath := writeFixture(b, f, b.TempDir())
			data, err := onnx.Marshal(f.Model)
			if err != nil {
				b.Fatal(err)
			}
			in := f.Batches[0].Inputs[0]
			outs := outputNames(f.Model)
			var tPlain, tRun, tAudit time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				for range plain {
					_, run := plainRun(b, data, in, outs)
					tRun += run
				}
				t1 := time.Now()
				cfg := Config{ModelPath: modelPath, Inputs: []string{batchPath}, NoFixes: true, Policy: policy}
				if _, err := Run(context.Background(), cfg); err != nil {
					b.Fatal(err)
				}
				tAudit += time.Since(t1)
				tPlain += t1.Sub(t0)
			}
			unit := fmt.Sprintf("%dplain", plain)
			b.ReportMetric(float64(tRun.Milliseconds())/float64(plain*b.N), "ms/plain")
			b.ReportMetric(float64(tPlain.Milliseconds())/float64(b.N), "ms/"+unit)
			b.ReportMetric(float64(tAudit.Milliseconds())/float64(b.N), "ms/audit")
			b.ReportMetric(float64(tAudit)/float64(tPlain), "audit/"+unit)
		})
	}
}

// childEnv names the variables that make TestAuditChild audit a model in a
// child process, so that the parent can read the child's peak RSS.
const (
	childModel  = "FP16AUDIT_CHILD_MODEL"
	childBatch  = "FP16AUDIT_CHILD_BATCH"
	childMemory = "FP16AUDIT_CHILD_MAX_MEMORY"
)

// TestAuditChild is not a test: BenchmarkMemory runs the test binary with
// it selected to audit one model in a process of its own.
func TestAuditChild(t *testing.T) {
	model := os.Getenv(childModel)
	if model == "" {
		t.Skip("runs only as BenchmarkMemory's child process")
	}
	maxMem, _ := strconv.ParseInt(os.Getenv(childMemory), 10, 64)
	start := time.Now()
	r, err := Run(context.Background(), Config{ModelPath: model, Inputs: []string{os.Getenv(childBatch)}, NoFixes: true, MaxMemory: maxMem})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("elapsed_ms %d\n", time.Since(start).Milliseconds())
	// The parent cannot use its wait4 rusage: Linux counts the parent's
	// memory at exec into the child's ru_maxrss.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			fmt.Printf("hwm_kb %s\n", f[1])
		}
	}
	for _, n := range r.Notes {
		fmt.Printf("note %s\n", n)
	}
}

// childAudit audits model in a child process and returns the time of
// audit.Run there and the child's peak RSS (VmHWM).
func childAudit(b *testing.B, model, batchFile string, maxMem int64) (time.Duration, int64, string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestAuditChild$", "-test.v")
	cmd.Env = append(os.Environ(), childModel+"="+model, childBatch+"="+batchFile, childMemory+"="+strconv.FormatInt(maxMem, 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("child audit: %v\n%s", err, out)
	}
	var hwm, ms int64
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "hwm_kb "); ok {
			hwm, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "elapsed_ms "); ok {
			ms, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	elapsed := time.Duration(ms) * time.Millisecond
	if hwm == 0 {
		b.Fatalf("child audit printed no peak RSS:\n%s", out)
	}
	return elapsed, hwm << 10, string(out)
}

// BenchmarkMemory audits each model in a child process twice: unsegmented
// (a budget above any need) and with --max-memory at a quarter of the
// first run's peak RSS, and once more with the default budget. Metrics: peak RSS
// of both, the budget, the model's weights, and the time ratio (targets:
// RSS within budget + weights + 10%, time ≤ 1.5× unsegmented).
func BenchmarkMemory(b *testing.B) {
	initRuntime(b)
	for _, f := range benchModels() {
		b.Run(f.Name, func(b *testing.B) {
			modelPath, batchPath := writeFixture(b, f, b.TempDir())
			var weights int64
			for _, t := range f.Model.Graph.Initializer {
				weights += onnx.TensorBytes(t)
			}
			var tWhole, tSeg, tDefault time.Duration
			var rssWhole, rssSeg, rssDefault, budget int64
			for i := 0; i < b.N; i++ {
				t, rss, _ := childAudit(b, modelPath, batchPath, 1<<50)
				tWhole += t
				rssWhole = max(rssWhole, rss)
				budget = rss / 4
				t, rss, out := childAudit(b, modelPath, batchPath, budget)
				tSeg += t
				rssSeg = max(rssSeg, rss)
				if i == 0 {
					b.Log(out)
				}
				t, rss, _ = childAudit(b, modelPath, batchPath, 0)
				tDefault += t
				rssDefault = max(rssDefault, rss)
			}
			mb := func(n int64) float64 { return float64(n) / (1 << 20) }
			b.ReportMetric(mb(weights), "MB-weights")
			b.ReportMetric(mb(rssWhole), "MB-rss")
			b.ReportMetric(mb(budget), "MB-budget")
			b.ReportMetric(mb(rssSeg), "MB-rss-seg")
			b.ReportMetric(float64(rssSeg)/float64(budget+weights), "rss-seg/(budget+weights)")
			b.ReportMetric(float64(tWhole.Milliseconds())/float64(b.N), "ms-whole")
			b.ReportMetric(float64(tSeg.Milliseconds())/float64(b.N), "ms-seg")
			b.ReportMetric(float64(tSeg)/float64(tWhole), "seg/whole")
			b.ReportMetric(mb(rssDefault), "MB-rss-default")
			b.ReportMetric(float64(tDefault.Milliseconds())/float64(b.N), "ms-default")
		})
	}
}
