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
        counts, max_abs, sums = grad_stats(torch.tensor(values))
        nonfinite, nonfinite_src, nonzero, underflow, subnormal, inexact = counts.tolist()
        self.assertEqual(nonfinite, 4)
        self.assertEqual(nonfinite_src, 2)
        self.assertEqual(nonzero, 11)
        self.assertEqual(underflow, 2)
        self.assertEqual(subnormal, 3)
        self.assertEqual(inexact, 7)
        self.assertEqual(max_abs.item(), 1e6)
        # The sums run over the 10 elements fp16 holds finite, against
        # torch's own cast in float64.
        x = torch.tensor(values, dtype=torch.float32).double()
        kept = x.abs() < 65520
        want = lost_sums(x[kept])
        self.assertEqual(sums.dtype, torch.float64)
        for got, w in zip(sums.tolist(), want):
            self.assertAlmostEqual(got, w, delta=1e-6 * w)

    def test_overflow_level_agrees_with_the_cast(self):
        # The overflow level uses the threshold 65520 instead of casting;
        # both must count the same elements, at the boundary and at random.
        torch.manual_seed(0)
        edge = torch.tensor([65504.0, 65519.99, 65520.0, -65520.0, 65536.0, float("nan"), -float("inf"), 1.0])
        for g in (edge, torch.randn(1000) * 40000, torch.randn(1000, dtype=torch.float64) * 40000):
            full, full_max, _ = grad_stats(g, full=True)
            light, light_max, light_sums = grad_stats(g, full=False)
            self.assertEqual(light_sums.tolist(), [0.0, 0.0])
            self.assertEqual(light.tolist()[:2], full.tolist()[:2])
            self.assertEqual(light.tolist()[2:], [0, 0, 0, 0])
            self.assertEqual(light_max.item(), full_max.item())
        self.assertEqual(grad_stats(edge, full=False)[0].tolist()[:2], [5, 2])

    def test_empty_and_all_nonfinite(self):
        counts, max_abs, sums = grad_stats(torch.empty(0))
        self.assertEqual(counts.tolist(), [0] * 6)
        self.assertEqual(sums.tolist(), [0.0, 0.0])
        counts, max_abs, sums = grad_stats(torch.tensor([float("nan"), float("inf")]))
        self.assertEqual(counts.tolist()[:3], [2, 2, 0])
        self.assertEqual(max_abs.item(), 0.0)
        self.assertEqual(sums.tolist(), [0.0, 0.0])

    def test_sums_of_tiny_gradients_do_not_underflow(self):
        # Squared in float32, 1e-30 would be 0: the sums must still say
        # that fp16 loses the whole gradient. (A float64 gradient below
        # 1e-154 has a sum of squares float64 cannot hold: out of scope.)
        for g in (torch.full((1000,), 1e-30), torch.full((10,), 1e-150, dtype=torch.float64),
                  torch.tensor([1e-40, 3e-45, 2e-39])):
            _, _, sums = grad_stats(g)
            want = lost_sums(g.double())
            self.assertGreater(sums[0].item(), 0)
            self.assertAlmostEqual(sums[0].item() / want[0], 1.0, places=5)
            self.assertAlmostEqual(sums[1].item() / sums[0].item(), 1.0, places=5)

    def test_sums_at_random_against_the_cast(self):
        torch.manual_seed(1)
        for g in (torch.randn(5000) * 1e-5, torch.randn(5000) * 30000, torch.randn(3, 700, dtype=torch.float64) * 1e-7):
            _, _, sums = grad_stats(g)
            want = lost_sums(g.double()[g.double().abs() < 65520])
            for got, w in zip(sums.tolist(), want):
                self.assertAlmostEqual(got / w, 1.0, places=5)


def lost_sums(x):
    """Σ x² and Σ (fp16(x) − x)² of a float64 tensor, by torch's own cast: the truth for grad_stats."""
    d = x.half().double() - x
    return [float((x * x).sum()), float((d * d).sum())]


def lost_mass(g, scale):
    """‖fp16(g·S)/S − g‖ / ‖g‖ in float64, g the unscaled gradient: the measure as defined."""
    g = g.double()
    d = (g * scale).half().double() / scale - g
    return float(d.norm() / g.norm())


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

    def test_mass_lost_against_torch(self):
        # quiet's output gradient: half its elements flush at 2^16, but
        # they are 1e-12 of the others, so it loses no mass to speak of;
        # with head's weights all tiny, every element is tiny and fp16
        # loses all of it at 2^16 and part of it (subnormal rounding) at
        # 2^24. The truth is torch's own cast of the gradient autograd
        # computes, in float64.
        for tiny, scale in ((False, 2.0**16), (True, 2.0**16), (True, 2.0**24)):
            model = quiet_model()
            if tiny:
                with torch.no_grad():
                    model.head.weight[:] = 0.5e-14
            tele = GradTelemetry(model)
            x = torch.randn(5, 4)
            h = model.quiet(model.first(x))
            h.retain_grad()
            model.zero_grad()
            (model.head(h).sum() * scale).backward()
            want = lost_mass(h.grad / scale, scale)
            # The parameter gradient pools weight and bias.
            pg = torch.cat([model.first.weight.grad.flatten(), model.first.bias.grad.flatten()]) / scale
            want_params = lost_mass(pg, scale)
            tele.reset()
            model.zero_grad()
            (model(x).sum() * scale).backward()
            rows = {r["name"]: r for r in tele.collect()}
            q = rows["quiet"]["output"]
            self.assertAlmostEqual(q["lost_mass"] / want, 1.0, places=5, msg=(tiny, scale))
            self.assertAlmostEqual(rows["first"]["params"]["lost_mass"] / want_params, 1.0, places=5)
            self.assertAlmostEqual(q["lost_sumsq"] / q["sumsq"], want * want, delta=1e-6 * want * want)
            if not tiny:
                self.assertEqual(q["underflow_fraction"], 0.5)
                # What is left is the rounding of the normal elements to
                # fp16's 11 bits: far below the 1% tolerance.
                self.assertLess(q["lost_mass"], 2.0**-11)
            elif scale == 2.0**16:
                self.assertEqual(q["lost_mass"], 1.0)
            else:
                self.assertGreater(q["lost_mass"], 0.01)
                self.assertLess(q["lost_mass"], 0.5)
            tele.remove()

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
        self.assertEqual((q["sumsq"], q["lost_sumsq"], q["lost_mass"]), (None,) * 3)
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
        # Nor what it lost: only the norm of what arrived is known.
        self.assertIsNone(g["lost_sumsq"])
        self.assertIsNone(g["lost_mass"])
        self.assertAlmostEqual(g["sumsq"], 3 * (1.0 + 4.0), places=3)
        self.assertEqual(g["nonzero"], 6)


if __name__ == "__main__":
    unittest.main()
