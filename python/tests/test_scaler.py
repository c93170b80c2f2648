import unittest

import support  # noqa: F401  (import path)
import torch
from torch import nn

from fp16audit import EmulatedGradScaler


def one_param_opt(grad_value):
    p = nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([p], lr=1.0)
    p.grad = torch.tensor([grad_value, 0.5])
    return p, opt


class ScalerRuleTest(unittest.TestCase):
    def test_scale_multiplies_and_disabled_passes_through(self):
        s = EmulatedGradScaler(init_scale=8.0)
        self.assertEqual(s.scale(torch.tensor(3.0)).item(), 24.0)
        a, b = s.scale([torch.tensor(1.0), torch.tensor(2.0)])
        self.assertEqual((a.item(), b.item()), (8.0, 16.0))
        off = EmulatedGradScaler(enabled=False)
        t = torch.tensor(3.0)
        self.assertIs(off.scale(t), t)
        self.assertEqual(off.get_scale(), 1.0)

    def test_clean_step_unscales_and_steps(self):
        s = EmulatedGradScaler(init_scale=4.0)
        p, opt = one_param_opt(8.0)
        s.step(opt)
        # grad 8/4 = 2, SGD lr 1: 1 - 2 = -1; 2 - 0.5/4
        self.assertEqual(p.detach().tolist(), [-1.0, 2.0 - 0.125])
        s.update()
        self.assertEqual(s.get_scale(), 4.0)

    def test_growth_after_interval_clean_steps(self):
        s = EmulatedGradScaler(init_scale=4.0, growth_interval=3)
        scales = []
        for _ in range(7):
            _, opt = one_param_opt(1.0)
            s.step(opt)
            s.update()
            scales.append(s.get_scale())
        self.assertEqual(scales, [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0])

    def test_overflow_skips_the_step_backs_off_and_resets_growth(self):
        s = EmulatedGradScaler(init_scale=64.0, growth_interval=2)
        _, opt = one_param_opt(1.0)
        s.step(opt)
        s.update()  # one clean step: tracker 1
        p, opt = one_param_opt(float("inf"))
        self.assertIsNone(s.step(opt))
        self.assertEqual(p.detach().tolist(), [1.0, 2.0], "the optimizer must not step")
        s.update()
        self.assertEqual(s.get_scale(), 32.0)
        # The backoff reset the tracker: one clean step is not enough to grow.
        _, opt = one_param_opt(1.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 32.0)
        _, opt = one_param_opt(1.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 64.0)

    def test_half_check_flags_gradients_out_of_fp16_range(self):
        # 65520 is finite in fp32 and Inf in fp16 (fp16 max 65504).
        s = EmulatedGradScaler(init_scale=2.0)
        p, opt = one_param_opt(65520.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 1.0)
        self.assertEqual(p.detach().tolist(), [1.0, 2.0])
        # 65504 fits: not an overflow.
        s = EmulatedGradScaler(init_scale=2.0)
        p, opt = one_param_opt(65504.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 2.0)
        self.assertEqual(p.detach().tolist(), [1.0 - 32752.0, 2.0 - 0.25])
        # Without half_check only real Inf/NaN count.
        s = EmulatedGradScaler(init_scale=2.0, half_check=False)
        p, opt = one_param_opt(65520.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 2.0)

    def test_watch_forces_an_overflow_until_removed(self):
        s = EmulatedGradScaler(init_scale=16.0)
        w = s.watch(lambda: True)
        _, opt = one_param_opt(1.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 8.0)
        w.remove()
        _, opt = one_param_opt(1.0)
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 8.0)

    def test_scale_is_float32_and_reaches_zero(self):
        # 2^16 halved 165 times is 2^-149, float32's smallest subnormal;
        # the next halving rounds to 0 (a Python float would not).
        s = EmulatedGradScaler()
        for _ in range(165):
            _, opt = one_param_opt(float("nan"))
            s.step(opt)
            s.update()
        self.assertEqual(s.get_scale(), 2.0**-149)
        _, opt = one_param_opt(float("nan"))
        s.step(opt)
        s.update()
        self.assertEqual(s.get_scale(), 0.0)

    def test_misuse_raises_like_gradscaler(self):
        s = EmulatedGradScaler()
        _, opt = one_param_opt(1.0)
        with self.assertRaisesRegex(RuntimeError, "No inf checks"):
            s.update()
        s.unscale_(opt)
        with self.assertRaisesRegex(RuntimeError, "already been called"):
            s.unscale_(opt)
        s.step(opt)
        with self.assertRaisesRegex(RuntimeError, "step\\(\\) has already been called"):
            s.step(opt)
        with self.assertRaisesRegex(RuntimeError, "after step"):
            s.unscale_(opt)
        with self.assertRaises(ValueError):
            EmulatedGradScaler(growth_factor=1.0)
        with self.assertRaises(ValueError):
            EmulatedGradScaler(backoff_factor=1.0)

    def test_state_dict_round_trip(self):
        s = EmulatedGradScaler(init_scale=32.0, growth_interval=5)
        _, opt = one_param_opt(1.0)
        s.step(opt)
        s.update()
        t = EmulatedGradScaler()
        t.load_state_dict(s.state_dict())
        self.assertEqual((t.get_scale(), t.get_growth_interval(), t.state_dict()["_growth_tracker"]), (32.0, 5, 1))


if __name__ == "__main__":
    unittest.main()
