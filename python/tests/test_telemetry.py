import unittest

import support
import torch
from torch import nn

from fp16audit import GradTelemetry, grad_stats


class HalfBoundary(nn.Module):
    """Returns its input as float16, so its output gradient arrives in float16 (as under autocast on a GPU)."""

    def forward(self, x):
        return x.half()


class GradStatsTest(unittest.TestCase):
    def test_counts_at_the_fp16_boundaries(self):
        values = [
            2.0**-25,         # halfway to 2^-24: rounds to even, 0 -> underflow
            -(2.0**-25),      # underflow
            1.5 * 2.0**-25,   # rounds up to 2^-24: survives, subnormal, inexact
            2.0**-24,         # smallest subnormal, exact
            1e-5,             # subnormal (< 2^-14), inexact
            2.0**-14,         # smallest normal: not subnormal
            1.0,
            65504.0,          # fp16 max, exact
            65519.0,          # rounds down to 65504, inexact
            65520.0,          # rounds to Inf
            -1e6,             # -Inf
            0.0,
            float("nan"),
            float("inf"),
        ]
        counts, max_abs = grad_stats(torch.tensor(values))
        nonfinite, nonfinite_src, nonzero, underflow, subnormal, inexact = counts.tolist()
        self.assertEqual(nonfinite, 4)
        self.assertEqual(nonfinite_src, 2)
        self.assertEqual(nonzero, 11)
        self.assertEqual(underflow, 2)
        self.assertEqual(subnormal, 3)
        self.assertEqual(inexact, 7)
        self.assertEqual(max_abs.item(), 1e6)

    def test_overflow_level_agrees_with_the_cast(self):
        # The overflow level uses the threshold 65520 instead of casting;
        # both must count the same elements, at the boundary and at random.
        torch.manual_seed(0)
        edge = torch.tensor([65504.0, 65519.99, 65520.0, -65520.0, 65536.0, float("nan"), -float("inf"), 1.0])
        for g in (edge, torch.randn(1000) * 40000, torch.randn(1000, dtype=torch.float64) * 40000):
            full, full_max = grad_stats(g, full=True)
            light, light_max = grad_stats(g, full=False)
            self.assertEqual(light.tolist()[:2], full.tolist()[:2])
            self.assertEqual(light.tolist()[2:], [0, 0, 0, 0])
            self.assertEqual(light_max.item(), full_max.item())
        self.assertEqual(grad_stats(edge, full=False)[0].tolist()[:2], [5, 2])

    def test_empty_and_all_nonfinite(self):
        counts, max_abs = grad_stats(torch.empty(0))
        self.assertEqual(counts.tolist(), [0] * 6)
        counts, max_abs = grad_stats(torch.tensor([float("nan"), float("inf")]))
        self.assertEqual(counts.tolist()[:3], [2, 2, 0])
        self.assertEqual(max_abs.item(), 0.0)


def quiet_model():
    """first -> quiet -> head, where half of quiet's output gradient is 1e-14 x the incoming gradient.

    With loss = head(...).sum() * scale, the output gradient of `quiet` at
    column j is scale * (head.weight[0, j] + head.weight[1, j]): 1e-14 *
    scale for j < 4 and 1e-2 * scale for j >= 4. At scale 2^16 the small
    half is 6.6e-10 <= 2^-25: flushed to zero in fp16. At 2^24 it is 1.7e-7:
    kept.
    """
    torch.manual_seed(3)
    model = nn.Sequential()
    model.add_module("first", nn.Linear(4, 8))
    model.add_module("quiet", nn.Linear(8, 8))
    model.add_module("head", nn.Linear(8, 2))
    with torch.no_grad():
        model.head.weight[:, :4] = 0.5e-14
        model.head.weight[:, 4:] = 0.5e-2
    return model


class TelemetryTest(support.TempDirMixin, unittest.TestCase):
    def run_once(self, model, scale, telemetry, x=None):
        x = torch.randn(5, model.first.in_features) if x is None else x
        model.zero_grad()
        (model(x).sum() * scale).backward()
        rows = {r["name"]: r for r in telemetry.collect()}
        telemetry.reset()
        return rows

    def test_underflowing_module_is_measured_at_the_current_scale(self):
        model = quiet_model()
        tele = GradTelemetry(model)
        rows = self.run_once(model, 2.0**16, tele)
        q = rows["quiet"]["output"]
        self.assertEqual(q["dtype"], "float32")
        self.assertEqual(q["numel"], 40)
        self.assertEqual(q["nonzero"], 40)
        self.assertEqual(q["underflow"], 20)
        self.assertEqual(q["underflow_fraction"], 0.5)
        self.assertEqual(q["nonfinite"], 0)
        self.assertAlmostEqual(q["max_abs"], 1e-2 * 2.0**16, delta=1e-3)
        h = rows["head"]["output"]
        self.assertEqual((h["underflow"], h["underflow_fraction"], h["max_abs"]), (0, 0.0, 2.0**16))
        # A larger scale lifts the small half above 2^-25: nothing flushes.
        rows = self.run_once(model, 2.0**24, tele)
        self.assertEqual(rows["quiet"]["output"]["underflow"], 0)
        self.assertEqual(rows["quiet"]["output"]["subnormal"], 20)

    def test_order_is_backward_order_and_modules_can_be_chosen(self):
        model = quiet_model()
        rows = self.run_once(model, 1.0, GradTelemetry(model))
        self.assertEqual(list(rows), ["head", "quiet", "first"])
        self.assertEqual(rows["quiet"]["type"], "Linear")
        self.assertEqual(rows["quiet"]["params"]["numel"], 8 * 8 + 8)
        self.assertEqual(rows["quiet"]["params"]["tensors"], 2)
        only = GradTelemetry(model, modules=["quiet"])
        rows = self.run_once(model, 1.0, only)
        self.assertEqual(list(rows), ["quiet"])
        with self.assertRaisesRegex(ValueError, "no module named 'nope'"):
            GradTelemetry(model, modules=["nope"])

    def test_hooks_observe_without_changing_gradients_and_go_away(self):
        model = quiet_model()
        x = torch.randn(5, 4)
        (model(x).sum() * 2.0**16).backward()
        plain = [p.grad.clone() for p in model.parameters()]
        tele = GradTelemetry(model)
        self.run_once(model, 2.0**16, tele, x=x)
        for p, g in zip(model.parameters(), plain):
            self.assertTrue(torch.equal(p.grad, g))
        tele.remove()
        for m in model.modules():
            self.assertEqual(len(m._forward_hooks), 0)
        for p in model.parameters():
            self.assertFalse(p._backward_hooks)

    def test_inplace_relu_after_a_watched_module(self):
        # register_full_backward_hook fails here ("is a view and is being
        # modified inplace"); the tensor hooks must not.
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
        tele = GradTelemetry(model)
        model(torch.randn(3, 4)).sum().backward()
        names = [r["name"] for r in tele.collect()]
        self.assertEqual(names, ["2", "0"])

    def test_accumulates_over_backward_passes_and_ignores_no_grad(self):
        model = quiet_model()
        tele = GradTelemetry(model)
        for _ in range(2):
            model(torch.randn(5, 4)).sum().backward()
        q = {r["name"]: r for r in tele.collect()}["quiet"]["output"]
        self.assertEqual((q["tensors"], q["numel"]), (2, 80))
        tele.reset()
        with torch.no_grad():
            model(torch.randn(5, 4))
        self.assertEqual(tele.collect(), [])

    def test_levels(self):
        model = quiet_model()
        tele = GradTelemetry(model, level="overflow")
        rows = self.run_once(model, 2.0**16, tele)
        q = rows["quiet"]["output"]
        self.assertEqual((q["nonfinite"], q["numel"]), (0, 40))
        self.assertEqual((q["nonzero"], q["underflow"], q["underflow_fraction"], q["subnormal"]), (None,) * 4)
        tele.level = "off"
        self.assertEqual(self.run_once(model, 2.0**16, tele), {})

    def test_float16_gradient_is_taken_as_delivered(self):
        model = nn.Sequential()
        model.add_module("lin", nn.Linear(4, 4))
        model.add_module("tohalf", HalfBoundary())
        tele = GradTelemetry(model, modules=["tohalf"])
        out = model(torch.randn(3, 4)).float()
        (out * torch.tensor([1.0, 1e-9, 70000.0, 2.0])).sum().backward()
        g = tele.collect()[0]["output"]
        self.assertEqual(g["dtype"], "float16")
        # 70000 is Inf in the fp16 gradient itself; 1e-9 flushed to zero
        # when it was cast: fp16 cannot show that it ever was nonzero.
        self.assertEqual((g["nonfinite"], g["nonfinite_src"]), (3, 3))
        self.assertIsNone(g["underflow"])
        self.assertIsNone(g["underflow_fraction"])
        self.assertEqual(g["nonzero"], 6)


if __name__ == "__main__":
    unittest.main()
