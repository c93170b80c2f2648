package audit_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fixture families of issue 41's front door (fixtures/torch/
// cases_trained.py and cases_stateful.py): trained-BatchNorm CNNs exported
// as users do by default (<case>_folded) and as fp16audit.audit() does,
// and recurrent and sequence-first models exported with the batch axes
// audit() infers; by torch 1.13's TorchScript exporter and torch 2.15's
// dynamo exporter, with each torch's truth.
const (
	trainedCases         = "../../fixtures/torch/cases_trained"
	trainedDynamoCases   = "../../fixtures/torch/cases_trained_dynamo"
	statefulCases        = "../../fixtures/torch/cases_stateful"
	statefulDynamoCases  = "../../fixtures/torch/cases_stateful_dynamo"
	foldedBatchNormWhy   = "BatchNorm folded into the Conv before it: the raw convolution output autocast holds in fp16 is not in the graph"
	foldedCaseNameSuffix = "_folded"
)

// foldedKnownWrong lists the folded exports of a trained family under the
// fp16 policies: no audit of such a file can see the overflow (it is what
// audit() said before it kept BatchNorm), so each is held as known wrong,
// and the test says so when one becomes right.
func foldedKnownWrong(t *testing.T, root string) map[string]string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(root, "*"+foldedCaseNameSuffix))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no folded exports under %s: %v", root, err)
	}
	out := map[string]string{}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		for _, p := range []string{"autocast-fp16", "half"} {
			out[filepath.Base(d)+"/"+p] = foldedBatchNormWhy
		}
	}
	return out
}

// TestTorchTruthTrained: the trained-BatchNorm CNNs as audit() exports
// them audit as PyTorch runs them (overflowing-op at the convolution, by
// module and node), and the same models exported with BatchNorm folded
// are the known failure audit() had.
func TestTorchTruthTrained(t *testing.T) {
	for _, root := range []string{trainedCases, trainedDynamoCases} {
		t.Run(filepath.Base(root), func(t *testing.T) {
			torchTruth(t, root, foldedKnownWrong(t, root))
		})
	}
}

// TestTorchTruthStateful: models whose batch axis is not axis 0 of every
// input (an LSTM's (h0, c0), a GRU's h0, sequence-first inputs), exported
// with the batch axes audit() infers, audit as PyTorch runs them.
func TestTorchTruthStateful(t *testing.T) {
	for _, root := range []string{statefulCases, statefulDynamoCases} {
		t.Run(filepath.Base(root), func(t *testing.T) {
			torchTruth(t, root, map[string]string{})
		})
	}
}

// TestTrainedFamiliesPair: every trained case comes as a pair, the folded
// export and audit()'s, so that the pair shows what the fold hides.
func TestTrainedFamiliesPair(t *testing.T) {
	for _, root := range []string{trainedCases, trainedDynamoCases} {
		dirs, err := filepath.Glob(filepath.Join(root, "*", "truth.json"))
		if err != nil || len(dirs) == 0 {
			t.Fatalf("no cases under %s: %v", root, err)
		}
		names := map[string]bool{}
		for _, p := range dirs {
			names[filepath.Base(filepath.Dir(p))] = true
		}
		for n := range names {
			other := n + foldedCaseNameSuffix
			if strings.HasSuffix(n, foldedCaseNameSuffix) {
				other = strings.TrimSuffix(n, foldedCaseNameSuffix)
			}
			if !names[other] {
				t.Errorf("%s: %s has no twin %s", root, n, other)
			}
		}
	}
}
