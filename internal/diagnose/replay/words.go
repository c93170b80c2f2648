package replay

import (
	"fmt"
	"math"
	"strings"

	"fp16audit/internal/diagnose/words"
	"fp16audit/report"
)

// phrases says a replay's fix from the one table of the trainers' words
// (internal/diagnose/words): in the words of the trainer that made the
// capture (its manifest's trainer), and in fastai's and PyTorch's, which
// the report keeps beside them.
type phrases struct {
	trainer, fastai, torch *words.Trainer
	// device is torch.autocast's device_type of the run; half whether it
	// trained under model.half() (the half policy), where modules are
	// kept in fp32 otherwise than under autocast.
	device string
	half   bool
}

// torchRow is the row of a capture whose trainer the table lacks: a loop
// of the user's own, said in PyTorch's words.
const torchRow = "torch"

// TrainerRow is the row of the words table (words.Names) a capture's
// fixes follow: the trainer that made it, or PyTorch's for a trainer the
// table lacks. The replay's training audit words its own fixes by it too.
func TrainerRow(trainer string) string {
	if _, ok := words.Lookup(trainer); !ok || trainer == "" {
		return torchRow
	}
	return trainer
}

func phrasesFor(trainer, device, policy string) phrases {
	t := words.For(TrainerRow(trainer))
	if device == "" {
		device = "cuda"
	}
	return phrases{trainer: t, fastai: words.For("fastai"), torch: words.For(torchRow), device: device, half: policy == "half"}
}

// label names the trainer whose words a fix's Words are.
func (p phrases) label() string { return p.trainer.Label }

// set fills a fix's words: the capture's trainer's, fastai's and
// PyTorch's.
func (p phrases) set(f *report.ReplayFix, modules []string) {
	f.Words = p.say(p.trainer, f, modules)
	f.Fastai = p.say(p.fastai, f, modules)
	f.Torch = p.say(p.torch, f, modules)
}

// say is one fix in one trainer's words.
func (p phrases) say(t *words.Trainer, f *report.ReplayFix, modules []string) string {
	switch f.Kind {
	case report.FixBF16:
		return t.BF16For(p.device)
	case report.FixFP32:
		return t.FP32
	case report.FixKeepFP32:
		mods, it, its, returns := "the module", "it", "its", "returns"
		if len(modules) > 0 {
			mods = strings.Join(modules, ", ")
		}
		if len(modules) > 1 {
			it, its, returns = "them", "their", "return"
		}
		return fmt.Sprintf("keep %s in fp32: %s", mods, t.Keep(p.half, p.device, it, its, returns))
	case report.FixDropBatch:
		return t.DropBatch
	case report.FixClip:
		c := "C"
		if f.ClipNorm != nil {
			c = fmt.Sprintf("%.3g", *f.ClipNorm)
		}
		return t.ClipAt(c)
	case report.FixLowerLR:
		l := "a tenth of it"
		if f.LR != nil {
			l = fmt.Sprintf("%.3g", *f.LR)
		}
		return t.LowerLRTo(l)
	case report.FixInitScale:
		if f.Scale != nil {
			return t.StartScale(exponentOf(*f.Scale))
		}
	}
	return ""
}

func exponentOf(s float64) int {
	_, e := math.Frexp(s)
	return e - 1
}
