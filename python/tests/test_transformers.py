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


class GrowthRegressor(nn.Module):
    """fixtures/torch/runs.py's forward_growth run as a model the Trainer
    trains: regression on unnormalized targets (about 60000) whose output
    layer's activation grows with training until it passes fp16's 65504;
    forward(x, labels) returns a ModelOutput with its L1 loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x, labels=None):
        from transformers.modeling_outputs import SequenceClassifierOutput

        y = self.net(x)
        return SequenceClassifierOutput(loss=None if labels is None else nn.functional.l1_loss(y.float(), labels), logits=y)


class Prices(torch.utils.data.Dataset):
    def __init__(self):
        torch.manual_seed(1000)
        self.x = torch.randn(512, 16)
        w = torch.randn(16)
        self.y = (self.x @ w).unsqueeze(1) * 8000 + 60000

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def recording(model):
    """PyTorch's side of a Trainer run, made without fp16audit: the weights
    before every optimizer step and the batch each training forward of the
    model (not a copy of it) was given."""
    from transformers import TrainerCallback

    snaps, batches = {}, []

    class Record(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            snaps[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def pre(m, args, kwargs):
        if m is model and m.training:
            batches.append({k: v.detach().clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

    model.register_forward_pre_hook(pre, with_kwargs=True)
    return Record(), snaps, batches


def replay_json(folder):
    from fp16audit import _binary

    p = subprocess.run([_binary.find_binary(), "replay", folder, "--format", "json"], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise AssertionError("fp16audit replay %s: exit %d: %s" % (folder, p.returncode, p.stderr))
    return json.loads(p.stdout)


class CaptureTest(support.TempDirMixin, unittest.TestCase):
    """The capture of the failing step in the real Trainer. transformers
    5.25 trains fp16=True in fp32 on a CPU (Accelerate holds no GradScaler
    there); these runs give the Trainer's Accelerator the GradScaler and
    autocast it holds on a GPU (support.accelerate_cpu_fp16), so the
    Trainer's own loop trains in real CPU fp16 kernels and fails by
    itself."""

    def test_a_mid_training_nan_is_captured_and_replayed_as_pytorch_records_it(self):
        from transformers import Trainer

        from fp16audit import Capture, CaptureStop
        from fp16audit.transformers import FP16AuditCallback

        model = GrowthRegressor()
        rec, snaps, batches = recording(model)
        cb = FP16AuditCallback(preflight=False, capture=Capture(self.path("caps"), on_event="stop"), loss_func=nn.L1Loss(), telemetry=True,
                               every=10)
        tr = quiet(Trainer(model=model, args=args(self.path("out"), fp16=True, max_steps=120, per_device_train_batch_size=32,
                                                  learning_rate=0.05, lr_scheduler_type="constant"),
                           train_dataset=Prices(), callbacks=[rec, cb]))
        support.accelerate_cpu_fp16(tr.accelerator)
        # The loss is Inf, but L1's gradient is its sign: finite, so the
        # GradScaler would apply the step. on_event="stop" keeps the
        # Trainer from that update the one way it can: CaptureStop.
        with self.assertRaises(CaptureStop) as ctx:
            tr.train()
        caps = [e for e in cb.captures if e.path]
        self.assertEqual([e.trigger for e in caps], ["nonfinite-loss"], cb.captures)
        self.assertIs(ctx.exception.event, caps[0])
        step = caps[0].step
        self.assertGreater(step, 20, "a mid-training failure, not one at the first steps")
        self.assertEqual(tr.state.global_step, step)
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, snaps[step][k]), "the failing step's update was applied to %s" % k)
        with open(os.path.join(caps[0].path, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        self.assertEqual((m["trainer"], m["precision"]["policy"], m["precision"]["autocast_device"]), ("transformers", "autocast-fp16", "cpu"))
        self.assertEqual((m["optimizer"]["class"], m["loss"]["name"], m["step_applied"]), ("AdamW", "l1", False))
        self.assertEqual(m["model"]["inputs"], ["x"])
        self.assertTrue(m["grad_scaler"]["enabled"])
        # the capture holds the step's weights and batch, as PyTorch's side recorded them
        from fp16audit import _safetensors

        state, _ = _safetensors.read(os.path.join(caps[0].path, "state", "model.safetensors"))
        for k, v in snaps[step].items():
            self.assertTrue(torch.equal(state[k], v), k)
        import numpy as np

        with np.load(os.path.join(caps[0].path, "batch.npz"), allow_pickle=False) as z:
            self.assertTrue(np.array_equal(z["x"], batches[step]["x"].numpy()))
        # PyTorch's record at that state: hooks on the step's forward and backward
        net = GrowthRegressor()
        net.load_state_dict(snaps[step])
        truth = support.pytorch_record().truth_of(net.net, batches[step]["x"], batches[step]["labels"], batches[step - 1]["x"],
                                                  nn.L1Loss(), step, m["grad_scaler"]["scale"])
        r = replay_json(caps[0].path)
        self.assertEqual(r["verdict"], truth["class"], r["verdict_text"])
        self.assertEqual(r["verdict"], "forward-overflow")
        self.assertEqual(r["culprit"]["module"], "net." + truth["fp16_forward"]["first_reaching_output"])
        self.assertTrue(r["culprit"]["earlier"], "the log's telemetry saw the activation grow")
        # the fixes in the Trainer's words
        self.assertEqual(r["capture"]["trainer_label"], "Hugging Face Trainer")
        bf16 = [f for f in r["fixes"] if f["kind"] == "bf16"]
        self.assertTrue(bf16 and all(f["words"] == "bf16=True in TrainingArguments" for f in bf16), r["fixes"])
        # the log: the raw losses to the failing step, its capture line last
        lines = [json.loads(x) for x in open(cb.log_path, encoding="utf-8")]
        # a run that stopped early: no end line
        self.assertEqual([x["kind"] for x in lines][-2:], ["step", "capture"])
        self.assertEqual(lines[-1]["path"], caps[0].path)
        self.assertEqual((lines[-2]["step"], lines[-2]["loss"], lines[-2]["skipped"]), (step, "Infinity", True))
        # fp16audit scales reads the Trainer's log and points to the capture, whose replay decides
        from fp16audit import _binary

        p = subprocess.run([_binary.find_binary(), "scales", cb.log_path, "--format", "json"], capture_output=True, text=True)
        self.assertIn(p.returncode, (0, 1), p.stderr)
        named = json.loads(p.stdout).get("captures") or []
        self.assertEqual([(c["step"], c["path"], c["replay"]) for c in named], [(step, caps[0].path, "fp16audit replay " + caps[0].path)])

    def test_a_language_models_capture_replays_its_backward_and_leaves_the_run_as_it_was(self):
        from transformers import Trainer

        from fp16audit.transformers import FP16AuditCallback

        class Request(FP16AuditCallback):
            def on_step_begin(self, args, state, control, **kw):
                if state.global_step == 2:
                    self.capture_now()

        def run(callbacks, out):
            m = llama(planted=False, seed=3)
            m.config.attention_dropout = 0.2  # the export's train-mode forward draws dropout masks too
            for layer in m.model.layers:
                layer.self_attn.attention_dropout = 0.2
            tr = quiet(Trainer(model=m, args=args(out, fp16=True, max_steps=4, per_device_train_batch_size=2), train_dataset=Tokens(),
                               callbacks=callbacks))
            support.accelerate_cpu_fp16(tr.accelerator)
            tr.train()
            return m

        cb = Request(preflight=False, capture=self.path("caps"))
        with_cb = run([cb], self.path("a"))
        without = run([], self.path("b"))
        # the capture (an export in train mode, with dropout) changed nothing in the run
        for (k, a), (_, b) in zip(with_cb.state_dict().items(), without.state_dict().items()):
            self.assertTrue(torch.equal(a, b), k)
        self.assertEqual([(e.trigger, e.step) for e in cb.captures], [("request", 2)])
        path = cb.captures[0].path
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        self.assertFalse(m["step_applied"], "a request is captured before the step's update")
        # the model computes its own loss: a causal LM's, said to the replay
        self.assertEqual((m["loss"]["name"], m["loss"]["lm_shift"], m["loss"]["class_axis"]), ("cross-entropy", True, "last"))
        self.assertEqual(m["model"]["inputs"], ["input_ids"])
        r = replay_json(path)
        # a healthy step: clean in every precision, as PyTorch's CPU fp16 step was (its loss finite, the step applied)
        self.assertEqual(r["verdict"], "not-reproduced", r["verdict_text"])
        self.assertIsNotNone(r["audit"]["training"]["backward"], "the LM loss's backward is replayed")
        self.assertTrue(math.isfinite(m["loss"]["value"]))


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
