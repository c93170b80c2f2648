import contextlib
import csv
import io
import json
import math
import unittest
import warnings

import support
import torch
from torch import nn

from fp16audit import FP16_MAX, AmpRecorder, EmulatedGradScaler, read_log
from fp16audit.convert import main as _convert_main


def convert_main(argv):
    with contextlib.redirect_stdout(io.StringIO()):
        return _convert_main(argv)


def strict_lines(path):
    """Parse every line as strict JSON: bare NaN/Infinity tokens are an error."""
    def refuse(tok):
        raise ValueError(f"bare {tok} token")

    with open(path, encoding="utf-8") as f:
        return [json.loads(line, parse_constant=refuse) for line in f]


def train_planted(path, steps=24, every=5, scaler_kwargs=None, on_skipped=True):
    """The plain AMP recipe on the planted-overflow model, on EmulatedGradScaler."""
    model = support.planted_overflow_model()
    data = support.batches(8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    scaler = EmulatedGradScaler(**(scaler_kwargs or {"growth_interval": 10}))
    with AmpRecorder(path, scaler, model, every=every, on_skipped=on_skipped, steps_per_epoch=len(data)) as rec:
        for step in range(steps):
            xb, yb = data[step % len(data)]
            loss = nn.functional.cross_entropy(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            rec.step(loss, epoch=step // len(data), iter=step % len(data))
            opt.zero_grad(set_to_none=True)
    return read_log(path)


class RecorderTest(support.TempDirMixin, unittest.TestCase):
    def test_planted_overflow_is_named(self):
        log = train_planted(self.path("run.jsonl"))
        self.assertEqual(log.header["grad_scaler"]["init_scale"], 65536.0)
        self.assertEqual(len(log.steps), 24)
        self.assertEqual(log.end, {"kind": "end", "steps": 24, "skipped": sum(s["skipped"] for s in log.steps),
                                   "telemetry_lines": len(log.telemetry)})
        # Step 0 ran at 2^16: planted's output gradient overflows fp16,
        # head's (nearer the loss) does not; planted is named.
        t0 = log.telemetry[0]
        self.assertEqual(t0["step"], 0)
        self.assertEqual(t0["reasons"], ["skipped", "interval"])
        self.assertEqual(t0["first_nonfinite_output"], "planted")
        mods = {m["name"]: m for m in t0["modules"]}
        self.assertEqual([m["name"] for m in t0["modules"]], ["head", "planted", "first"])
        self.assertEqual(mods["head"]["output"]["nonfinite"], 0)
        self.assertLess(mods["head"]["output"]["max_abs"], FP16_MAX)
        self.assertGreater(mods["planted"]["output"]["nonfinite"], 0)
        self.assertGreater(mods["planted"]["output"]["max_abs"], FP16_MAX)
        # Every skipped step has telemetry that names planted, through its
        # output gradient or its weight gradient.
        skipped = [s["step"] for s in log.steps if s["skipped"]]
        self.assertEqual(skipped[:6], list(range(6)))
        by_step = {t["step"]: t for t in log.telemetry}
        for n in skipped:
            self.assertIn("skipped", by_step[n]["reasons"])
            self.assertIn("planted", (by_step[n]["first_nonfinite_output"], by_step[n]["first_nonfinite_params"]))
        # Interval lines (every 5 steps) once the scale has settled: clean.
        self.assertEqual(by_step[10]["reasons"], ["interval"])
        self.assertIsNone(by_step[10]["first_nonfinite_output"])
        self.assertIsNone(by_step[10]["first_nonfinite_params"])

    def test_telemetry_values_match_autograd(self):
        path = self.path("run.jsonl")
        log = train_planted(path, steps=1)
        # The same model and batch, differentiated directly in fp32.
        model = support.planted_overflow_model()
        xb, yb = support.batches(8)[0]
        acts = {}

        def keep(name):
            def hook(module, inputs, output):
                output.retain_grad()
                acts[name] = output
            return hook

        for name in ("planted", "head"):
            getattr(model, name).register_forward_hook(keep(name))
        (nn.functional.cross_entropy(model(xb), yb) * 65536.0).backward()
        mods = {m["name"]: m for m in log.telemetry[0]["modules"]}
        for name in ("planted", "head"):
            g = acts[name].grad
            out = mods[name]["output"]
            self.assertAlmostEqual(out["max_abs"], g.abs().max().item(), delta=1e-6 * g.abs().max().item())
            self.assertEqual(out["nonfinite"], int((g.abs() >= 65520).sum()))
            self.assertEqual(out["underflow"], int(((g != 0) & (g.abs() <= 2.0**-25)).sum()))
        w = model.planted.weight.grad
        self.assertEqual(mods["planted"]["params"]["nonfinite"],
                         int((w.abs() >= 65520).sum()) + int((model.planted.bias.grad.abs() >= 65520).sum()))

    def test_scale_fields_and_skips_follow_the_scaler(self):
        log = train_planted(self.path("run.jsonl"), steps=30, scaler_kwargs={"growth_interval": 4})
        prev = log.header["grad_scaler"]["init_scale"]
        for s in log.steps:
            self.assertEqual(s["scale_used"], prev)
            self.assertEqual(s["skipped"], s["scale"] < s["scale_used"])
            if not s["skipped"]:
                self.assertIn(s["scale"], (s["scale_used"], 2 * s["scale_used"]))
            else:
                self.assertEqual(s["scale"], s["scale_used"] / 2)
            prev = s["scale"]
        self.assertTrue(any(s["scale"] > s["scale_used"] for s in log.steps), "growth_interval 4 should grow")

    def test_every_zero_writes_telemetry_for_skipped_steps_only(self):
        log = train_planted(self.path("run.jsonl"), every=0)
        self.assertEqual([t["step"] for t in log.telemetry], [s["step"] for s in log.steps if s["skipped"]])
        self.assertTrue(all(t["reasons"] == ["skipped"] for t in log.telemetry))
        self.assertTrue(all(t["measured"] == "overflow" for t in log.telemetry))
        out = log.telemetry[0]["modules"][1]["output"]
        self.assertEqual((out["underflow"], out["nonzero"]), (None, None))

    def test_interval_lines_are_full_and_skipped_ones_overflow_only(self):
        log = train_planted(self.path("run.jsonl"), every=5)
        measured = {t["step"]: t["measured"] for t in log.telemetry}
        self.assertEqual(measured[0], "full")
        self.assertEqual(measured[1], "overflow")
        self.assertEqual(measured[10], "full")
        full = {m["name"]: m for m in log.telemetry[0]["modules"]}
        self.assertIsNotNone(full["planted"]["output"]["underflow_fraction"])

    def test_on_skipped_false_writes_interval_lines_only(self):
        log = train_planted(self.path("run.jsonl"), every=5, on_skipped=False)
        self.assertEqual([t["step"] for t in log.telemetry], [0, 5, 10, 15, 20])
        self.assertFalse(log.header["telemetry"]["on_skipped"])

    def test_lines_are_strict_json_with_nonfinite_as_strings(self):
        path = self.path("nan.jsonl")
        scaler = EmulatedGradScaler()
        with AmpRecorder(path, scaler) as rec:
            for loss in (1.5, float("nan"), float("inf"), float("-inf")):
                p = nn.Parameter(torch.ones(1))
                opt = torch.optim.SGD([p], lr=0.1)
                p.grad = torch.tensor([loss])
                scaler.step(opt)
                scaler.update()
                rec.step(torch.tensor(loss))
        lines = strict_lines(path)
        self.assertEqual([ln["loss"] for ln in lines[1:5]], [1.5, "NaN", "Infinity", "-Infinity"])
        self.assertEqual([ln["skipped"] for ln in lines[1:5]], [False, True, True, True])
        self.assertEqual(lines[0]["telemetry"], None)
        log = read_log(path)
        self.assertTrue(math.isnan(log.steps[1]["loss"]))
        self.assertEqual(log.steps[3]["loss"], -math.inf)

    def test_without_a_working_scaler_records_losses_only(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # GradScaler warns that CUDA is missing
            real = torch.cuda.amp.GradScaler()
        self.assertFalse(real.is_enabled())
        for scaler, want in ((real, {"enabled": False, "class": "GradScaler"}), (None, None)):
            path = self.path("fp32.jsonl")
            with AmpRecorder(path, scaler) as rec:
                rec.step(2.5)
                rec.step(2.25)
            log = read_log(path)
            self.assertEqual(log.header["grad_scaler"], want)
            self.assertEqual([(s["loss"], s["scale"], s["scale_used"], s["skipped"]) for s in log.steps],
                             [(2.5, None, None, False), (2.25, None, None, False)])

    def test_a_run_that_raises_leaves_no_end_line_and_no_hooks(self):
        model = support.planted_overflow_model()
        path = self.path("crash.jsonl")
        with self.assertRaises(KeyboardInterrupt):
            with AmpRecorder(path, EmulatedGradScaler(), model) as rec:
                rec.step(1.0)
                raise KeyboardInterrupt
        log = read_log(path)
        self.assertIsNone(log.end)
        self.assertEqual(len(log.steps), 1)
        self.assertTrue(all(len(m._forward_hooks) == 0 for m in model.modules()))


class ConvertTest(support.TempDirMixin, unittest.TestCase):
    def test_json_and_csv_forms(self):
        src = self.path("run.jsonl")
        log = train_planted(src, steps=10)
        self.assertEqual(convert_main([src, self.path("run.json")]), 0)
        with open(self.path("run.json")) as f:
            obj = json.load(f)
        self.assertEqual(obj["scales"], [s["scale"] for s in log.steps])
        self.assertEqual(obj["losses"], [s["loss"] for s in log.steps])
        self.assertEqual(obj["steps_per_epoch"], 8)
        self.assertEqual(obj["grad_scaler"], {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                              "growth_interval": 10})
        self.assertEqual(convert_main([src, self.path("run.csv")]), 0)
        with open(self.path("run.csv"), newline="") as f:
            rows = list(csv.reader(f))
        self.assertEqual(rows[0], ["step", "epoch", "loss", "scale"])
        self.assertEqual(rows[1], ["0", "0", repr(log.steps[0]["loss"]), "32768.0"])
        self.assertEqual(len(rows), 11)

    def test_nan_losses_stay_readable(self):
        src = self.path("nan.jsonl")
        with AmpRecorder(src, None) as rec:
            rec.step(float("nan"))
        self.assertEqual(convert_main([src, self.path("nan.json")]), 0)
        with open(self.path("nan.json")) as f:
            self.assertIn("NaN", f.read())
        self.assertEqual(convert_main([src, self.path("nan.csv")]), 0)
        with open(self.path("nan.csv")) as f:
            self.assertEqual(f.read().splitlines(), ["step,loss", "0,nan"])


if __name__ == "__main__":
    unittest.main()
