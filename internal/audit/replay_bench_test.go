package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"fp16audit/internal/capture"
)

// BenchmarkReplay times `fp16audit replay` of a capture against the
// training audit of the same model, batch, loss and scale (`fp16audit run
// model.onnx -i batch.npz --mode train --loss ... --init-scale ...`, what
// a user would run by hand), in the same iteration, and reports the ratio
// replay/audit by the wall clock and by CPU time. The replay adds the
// capture's checks (the files it reads hashed, the weights beside the
// audit), the bf16 backward and the failing modules kept in fp32 where
// the captured scale fails, the previous batch's forward (one more run of
// the same audit) where the forward fails — and skips the backward there
// — and the diagnosis.
// Captures: the run fixtures (fixtures/torch/runs, small models) and,
// when FP16AUDIT_BENCH_CAPTURE names one, that capture (python/bench_capture.py
// --keep DIR writes one of a large model).
func BenchmarkReplay(b *testing.B) {
	initRuntime(b)
	caps, _ := filepath.Glob("../../fixtures/torch/runs/*/captures/*")
	if p := os.Getenv("FP16AUDIT_BENCH_CAPTURE"); p != "" {
		caps = []string{p}
	}
	for _, dir := range caps {
		b.Run(filepath.Base(filepath.Dir(filepath.Dir(dir)))+"/"+filepath.Base(dir), func(b *testing.B) {
			c, err := capture.Open(dir)
			if err != nil {
				b.Fatal(err)
			}
			cfg, _, err := replayConfig(ReplayConfig{Capture: dir}, c)
			if err != nil {
				b.Fatal(err)
			}
			// the training audit a user would run: bf16 verified only
			// where the audit itself asks for it
			cfg.Train.VerifyFixes, cfg.Train.ForwardFirst = false, false
			var tAudit, tReplay, cAudit, cReplay time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0, c0 := time.Now(), cpuTime()
				if _, err := Run(context.Background(), cfg); err != nil {
					b.Fatal(err)
				}
				t1, c1 := time.Now(), cpuTime()
				if _, err := Replay(context.Background(), ReplayConfig{Capture: dir}); err != nil {
					b.Fatal(err)
				}
				tAudit += t1.Sub(t0)
				tReplay += time.Since(t1)
				cAudit += c1 - c0
				cReplay += cpuTime() - c1
			}
			n := float64(b.N)
			b.ReportMetric(float64(tAudit.Microseconds())/n/1e3, "ms/training-audit")
			b.ReportMetric(float64(tReplay.Microseconds())/n/1e3, "ms/replay")
			b.ReportMetric(float64(tReplay)/float64(tAudit), "replay/audit")
			b.ReportMetric(float64(cReplay)/float64(cAudit), "cpu-replay/audit")
		})
	}
}
