"""fp16audit.transformers.FP16AuditCallback with the real Hugging Face Trainer (and TRL's SFTTrainer).

transformers 5.25's Trainer accepts fp16=True on a CPU and trains it in
fp32 (Accelerate enables autocast and its GradScaler only on an
accelerator), so these runs are the real Trainer with its fp16 flag as a
user sets it; the callback audits what fp16=True does on a GPU (fp16
emulated by the binary) and says so in the report's notes. Models are
random-init from configs at small sizes; the failing one carries a massive
activation planted in layer 0's MLP (down_proj's output past 65504), as
trained LLMs have them.
"""

import json
import math
import os
import subprocess
import unittest
import warnings

import support
import torch
from torch import nn


def setUpModule():
    support.require_trainers("transformers", "accelerate")
    warnings.filterwarnings("ignore")
    import transformers

    # the loaders' progress bars and notices are not the tests' output
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


VOCAB = 128


def llama(planted=False, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg)
    if planted:
        plant_massive(m, Tokens().ids[:4])
    return m


def plant_massive(m, ids, peak=1.0e5):
    """A massive activation as trained LLMs have them: one intermediate
    unit of layer 0's MLP fires strongly on every token and reaches one
    residual channel through one down_proj weight, calibrated so that
    down_proj's output peaks at peak on ids (every weight stays within
    fp16's range)."""
    mlp = m.model.layers[0].mlp
    ch, unit = 20, 25
    seen = {}
    with torch.no_grad():
        mlp.gate_proj.weight[unit] *= 40.0
        mlp.up_proj.weight[unit] *= 40.0
        mlp.down_proj.weight[:, unit] = 0.0
        mlp.down_proj.weight[ch, unit] = 1.0
        h = mlp.down_proj.register_forward_hook(lambda mod, i, o: seen.__setitem__("y", o))
        m(ids)
        h.remove()
        mlp.down_proj.weight[ch, unit] = peak / float(seen["y"][..., ch].abs().max())


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=16, seq=16, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def args(tmp, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=tmp, report_to=[], per_device_train_batch_size=4, max_steps=3, logging_steps=1, save_strategy="no",
                disable_tqdm=True, seed=0, data_seed=0)
    base.update(kw)
    return TrainingArguments(**base)


def quiet(trainer):
    """The Trainer without its console printer (disable_tqdm=True prints every log line)."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def down_proj_max(m, ids):
    seen = {}
    h = m.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, i, o: seen.__setitem__("y", o))
    with torch.no_grad():
        m(ids)
    h.remove()
    return float(seen["y"].abs().max())


class TrainerTest(support.TempDirMixin, unittest.TestCase):
    def test_planted_model_really_passes_fp16s_range(self):
        # PyTorch's truth for the fixture of the tests below: the planted
        # down_proj's fp32 output is beyond 65504, and CPU autocast fp16
        # makes it Inf
        m = llama(planted=True).eval()
        ids = Tokens().ids[:4]
        self.assertGreater(down_proj_max(m, ids), 65504)
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(ids).logits
        self.assertFalse(torch.isfinite(out).all())
        self.assertLess(down_proj_max(llama(planted=False).eval(), ids), 100)

    def test_fp16_nan_stops_the_trainer_before_its_first_step(self):
        from transformers import Trainer

        from fp16audit.transformers import FP16AuditCallback, PreflightFailed

        m = llama(planted=True)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        cb = FP16AuditCallback(progress=False)
        tr = quiet(Trainer(model=m, args=args(self.tmp, fp16=True), train_dataset=Tokens(), callbacks=[cb]))
        with self.assertRaises(PreflightFailed) as ctx:
            tr.train()
        self.assertEqual(tr.state.global_step, 0)
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        r = ctx.exception.report
        self.assertIs(r, cb.report)
        self.assertEqual(r.verdict, "overflowing-op")
        self.assertEqual(r.policy, "autocast-fp16")
        self.assertIn("model.layers.0.mlp.down_proj", r.modules)
        summaries = " | ".join(f["summary"] for f in r.working_fixes)
        self.assertIn("bf16=True in TrainingArguments removes every overflow", summaries)
        self.assertIn("_keep_in_fp32_modules does not do it under fp16=True", summaries)
        self.assertNotIn("learn.", summaries)
        self.assertIn("bf16=True in TrainingArguments", str(ctx.exception))
        self.assertTrue(any("trains fp16=True in fp32" in n for n in r.notes), r.notes)

    def test_warn_only_warns_and_the_run_goes_on(self):
        from transformers import Trainer

        from fp16audit.transformers import FP16AuditCallback

        cb = FP16AuditCallback(warn=True, progress=False)
        tr = quiet(Trainer(model=llama(planted=True), args=args(self.tmp, fp16=True), train_dataset=Tokens(), callbacks=[cb]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tr.train()
        self.assertEqual(tr.state.global_step, 3)
        self.assertTrue(any("overflowing-op" in str(w.message) for w in caught))
        self.assertFalse(cb.report.ok)

    def test_bf16_policy_is_audited_as_bf16(self):
        from transformers import Trainer

        from fp16audit.transformers import FP16AuditCallback

        # bf16=True on a CPU needs use_cpu=True; Accelerate then runs real
        # CPU bf16 autocast
        cb = FP16AuditCallback(progress=False)
        tr = quiet(Trainer(model=llama(planted=True), args=args(self.tmp, bf16=True, use_cpu=True, max_steps=1), train_dataset=Tokens(), callbacks=[cb]))
        tr.train()
        self.assertEqual(cb.report.policy, "autocast-bf16")
        self.assertTrue(cb.report.ok, cb.report.verdict_text)
        self.assertEqual(tr.state.global_step, 1)

    def test_healthy_model_trains_untouched(self):
        from transformers import Trainer

        from fp16audit.transformers import FP16AuditCallback

        def run(callbacks, out):
            m = llama(planted=False, seed=3)
            ds = Tokens()
            tr = quiet(Trainer(model=m, args=args(out, fp16=True, max_steps=4, per_device_train_batch_size=2), train_dataset=ds, callbacks=callbacks))
            tr.train()
            return m, tr

        cb = FP16AuditCallback(progress=False)
        with_cb, tr = run([cb], self.path("with"))
        without, _ = run([], self.path("without"))
        self.assertTrue(cb.report.ok)
        self.assertEqual(cb.report.verdict, "healthy")
        self.assertEqual(tr.state.global_step, 4)
        # same data order, masks and updates: the preflight drew its batches
        # without touching the sampler or a random state
        for (k, a), (_, b) in zip(with_cb.state_dict().items(), without.state_dict().items()):
            self.assertTrue(torch.equal(a, b), k)
        # the raw losses in fp16audit's log, one line per optimizer step
        lines = [json.loads(x) for x in open(cb.log_path, encoding="utf-8")]
        self.assertEqual(lines[0]["kind"], "header")
        self.assertEqual(lines[0]["source"], "transformers")
        self.assertEqual([x["step"] for x in lines if x["kind"] == "step"], [0, 1, 2, 3])
        self.assertEqual(lines[-1]["kind"], "end")
        self.assertEqual(os.path.dirname(cb.log_path), self.path("with"))


class Regression(nn.Module):
    """A model the Trainer drives like any other: forward(x, labels) returns {"loss": ...}."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        y = self.lin(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


class Rows(torch.utils.data.Dataset):
    """8 rows; row 5 holds NaN (a data problem at step 2 with batches of 2)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(8, 4, generator=g)
        self.x[5, 1] = math.nan
        self.y = torch.randn(8, generator=g)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class RawLossTest(support.TempDirMixin, unittest.TestCase):
    def test_the_log_keeps_the_nan_that_logging_nan_inf_filter_hides(self):
        from transformers import Trainer

        from fp16audit.transformers import FP16AuditCallback

        cb = FP16AuditCallback(preflight=False)
        tr = quiet(Trainer(model=Regression(), args=args(self.tmp, max_steps=4, per_device_train_batch_size=2, logging_nan_inf_filter=True,
                                                          max_grad_norm=0.0), train_dataset=Rows(), callbacks=[cb]))
        tr.train()
        logged = [h["loss"] for h in tr.state.log_history if "loss" in h]
        self.assertTrue(all(math.isfinite(x) for x in logged), logged)  # the Trainer's logs: filtered
        steps = [json.loads(x) for x in open(cb.log_path, encoding="utf-8")]
        losses = [s["loss"] for s in steps if s["kind"] == "step"]
        # step 2's batch holds the NaN, and its update poisons the weights
        self.assertEqual(losses[2:], ["NaN", "NaN"], losses)
        self.assertTrue(all(isinstance(x, float) and math.isfinite(x) for x in losses[:2]), losses)
        # fp16audit scales reads it and finds the first NaN at step 2
        from fp16audit import _binary

        p = subprocess.run([_binary.find_binary(), "scales", cb.log_path, "--format", "json"], capture_output=True, text=True)
        self.assertIn(p.returncode, (0, 1), p.stderr)
        doc = json.loads(p.stdout)
        self.assertEqual(doc["run"]["steps"], 4)
        self.assertEqual(doc["run"]["format"], "trainlog")
        self.assertEqual(doc["losses"]["first_nonfinite_step"], 2)


class SFTTrainerTest(support.TempDirMixin, unittest.TestCase):
    def setUp(self):
        super().setUp()
        support.require_trainers("trl", "datasets")

    def test_sft_trainer_is_stopped_too(self):
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        from fp16audit.transformers import FP16AuditCallback, PreflightFailed

        ids = Tokens().ids
        ds = Dataset.from_dict({"input_ids": [list(map(int, r)) for r in ids]})
        cfg = SFTConfig(output_dir=self.tmp, report_to=[], per_device_train_batch_size=4, max_steps=2, fp16=True, save_strategy="no",
                        disable_tqdm=True, dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False)
        m = llama(planted=True)
        cb = FP16AuditCallback(progress=False)
        tr = quiet(SFTTrainer(model=m, args=cfg, train_dataset=ds, processing_class=_tokenizer(), callbacks=[cb]))
        with self.assertRaises(PreflightFailed):
            tr.train()
        self.assertEqual(tr.state.global_step, 0)
        self.assertIn("model.layers.0.mlp.down_proj", cb.report.modules)


def _tokenizer():
    """A word-level tokenizer made here (no hub): SFTTrainer wants one for padding."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    vocab.update({"w%d" % i: i for i in range(2, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


if __name__ == "__main__":
    unittest.main()
