"""learn.fp16audit() and FP16Preflight on real fastai (2.7.18) learners built from synthetic data.

- vision: a DataBlock of PNG images; raw 0-255 pixels (IntToFloatTensor(div=1),
  no Normalize) into a CNN whose stem responds like a trained one ->
  unnormalized-input, the preflight stops the fit before its first batch;
  the same images with Normalize -> healthy, and the fit runs;
- tabular: tabular_learner with an unscaled continuous column (~2e5);
- tokens: an embedding model over token ids, a Datasets of (ids, label).
"""

import os
import unittest
import warnings

import numpy as np
import support
import torch
from torch import nn


def setUpModule():
    support.require_fastai()
    warnings.filterwarnings("ignore", message=".*CUDA is not available.*")


def stem_cnn(gain=1000.0):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    with torch.no_grad():
        m[0].weight.mul_(gain)
    return m


class VisionTest(support.TempDirMixin, unittest.TestCase):
    def setUp(self):
        super().setUp()
        from PIL import Image

        rng = np.random.default_rng(0)
        for c in ("cat", "dog"):
            os.makedirs(self.path(c))
            for i in range(8):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(self.path("%s/%d.png" % (c, i)))

    def dls(self, raw):
        from fastai.vision.all import (CategoryBlock, DataBlock, ImageBlock, IntToFloatTensor, Normalize, RandomSplitter,
                                       Resize, get_image_files, imagenet_stats, parent_label)

        tfms = [IntToFloatTensor(div=1)] if raw else [Normalize.from_stats(*imagenet_stats)]
        block = DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=get_image_files, get_y=parent_label,
                          splitter=RandomSplitter(0.25, seed=0), item_tfms=Resize(32), batch_tfms=tfms)
        return block.dataloaders(self.tmp, bs=4, num_workers=0)

    def learner(self, raw):
        from fastai.vision.all import CrossEntropyLossFlat, Learner

        return Learner(self.dls(raw), stem_cnn(), loss_func=CrossEntropyLossFlat()).to_fp16()

    def test_raw_pixels_are_unnormalized_input_with_fastais_fix(self):
        import fp16audit.fastai  # noqa: F401  (adds Learner.fp16audit)

        learn = self.learner(raw=True)
        xb, _ = learn.dls.one_batch()
        self.assertGreater(float(xb.max()), 200)  # raw pixels reach the model
        r = learn.fp16audit(n_batches=2)
        self.assertEqual(r.verdict, "unnormalized-input", r.verdict_text)
        self.assertEqual(r.policy, "autocast-fp16")
        self.assertEqual(len(r.json["batches"]), 2)
        std = [f for f in r.fixes if f["kind"] == "standardize-inputs"][0]
        self.assertTrue(std["works"])
        self.assertIn("Normalize.from_stats", std["summary"])  # fastai's words
        self.assertEqual(r.training["mode"], "train")  # the learner's loss: the backward was audited

    def test_normalized_pixels_are_healthy(self):
        import fp16audit.fastai  # noqa: F401

        r = self.learner(raw=False).fp16audit(loss=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertTrue(r.ok)

    def test_a_vision_learners_head_drops_the_same_elements_in_every_backward_run(self):
        # vision_learner's head holds two Dropouts. The backward audit
        # compares runs of one ONNX Runtime session, which drew a new mask
        # at every run: every vision learner read as backward-underflow
        # (fp16 "losing" 144 % of a BatchNorm's gradient), with a dozen
        # modules to keep in fp32. The draws are now fixed per node.
        import fp16audit.fastai  # noqa: F401
        from fastai.vision.all import CrossEntropyLossFlat, resnet18, vision_learner

        torch.manual_seed(0)
        learn = vision_learner(self.dls(raw=False), resnet18, pretrained=False, loss_func=CrossEntropyLossFlat()).to_fp16()
        r = learn.fp16audit(n_batches=1)
        self.assertEqual(r.training["mode"], "train")
        self.assertEqual(r.training["dropouts"], 2)
        backward = r.training["backward"]
        self.assertEqual(backward["verdict"], "healthy", backward["verdict_text"])

    def test_preflight_stops_the_fit_before_its_first_batch(self):
        from fastai.callback.core import Callback

        from fp16audit.fastai import FP16Preflight

        class CountBatches(Callback):
            n = 0

            def before_batch(self):
                CountBatches.n += 1

        learn = self.learner(raw=True)
        pre = FP16Preflight(n_batches=1, loss=False)
        with learn.no_bar(), learn.no_logging():
            learn.fit(1, cbs=[pre, CountBatches()])
        self.assertEqual(CountBatches.n, 0)
        self.assertEqual(pre.report.verdict, "unnormalized-input")
        self.assertIs(learn.fp16audit_report, pre.report)
        # warn=True: the same verdict as a warning, and the fit runs
        learn = self.learner(raw=True)
        with learn.no_bar(), learn.no_logging(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            learn.fit(1, cbs=[FP16Preflight(n_batches=1, loss=False, warn=True), CountBatches()])
        self.assertGreater(CountBatches.n, 0)
        self.assertTrue(any("unnormalized-input" in str(x.message) for x in w))
        # healthy: the fit runs
        CountBatches.n = 0
        learn = self.learner(raw=False)
        with learn.no_bar(), learn.no_logging():
            learn.fit(1, cbs=[FP16Preflight(n_batches=1, loss=False), CountBatches()])
        self.assertGreater(CountBatches.n, 0)

    def test_policy_and_loss_come_from_the_learner(self):
        from fastai.vision.all import Learner, MSELossFlat

        from fp16audit.fastai import learner_loss, learner_policy

        learn = self.learner(raw=False)
        self.assertEqual(learner_policy(learn)[0], "autocast-fp16")
        learn.to_fp32().to_bf16()
        self.assertEqual(learner_policy(learn)[0], "autocast-bf16")
        learn.to_fp32().to_fp16(init_scale=2.0 ** 10)
        self.assertEqual(learner_policy(learn)[:2], ("autocast-fp16", 2.0 ** 10))
        plain = Learner(self.dls(False), stem_cnn(), loss_func=MSELossFlat())
        policy, _, note = learner_policy(plain)
        self.assertEqual(policy, "autocast-fp16")
        self.assertIn("no MixedPrecision", note)
        self.assertEqual(learner_loss(learn)[0], "cross-entropy")
        self.assertEqual(learner_loss(plain)[0], "mse")
        plain.loss_func = nn.SmoothL1Loss()
        name, _, note = learner_loss(plain)
        self.assertIsNone(name)
        self.assertIn("SmoothL1Loss", note)


class TabularTest(unittest.TestCase):
    def test_an_unscaled_column_is_unnormalized_input(self):
        import pandas as pd
        from fastai.tabular.all import Categorify, TabularDataLoaders, tabular_learner

        import fp16audit.fastai  # noqa: F401

        rng = np.random.default_rng(0)
        n = 64
        df = pd.DataFrame({"workclass": rng.choice(["a", "b", "c"], n), "age": rng.normal(40, 10, n),
                           "fnlwgt": rng.lognormal(12.0, 0.5, n), "y": rng.integers(0, 2, n)})
        dls = TabularDataLoaders.from_df(df, y_names="y", cat_names=["workclass"], cont_names=["age", "fnlwgt"],
                                         procs=[Categorify], y_block=None, bs=16, num_workers=0)
        torch.manual_seed(0)
        learn = tabular_learner(dls, layers=[16], n_out=2).to_fp16()
        r = learn.fp16audit(n_batches=1, loss=False)
        self.assertEqual(r.verdict, "unnormalized-input", r.verdict_text)
        self.assertEqual([i["name"] for i in r.json["inputs"]], ["x_cat", "x_cont"])
        std = [f for f in r.fixes if f["kind"] == "standardize-inputs"][0]
        self.assertEqual(std["inputs"], ["x_cont"])
        self.assertIn("Normalize", std["summary"])


class TokenTest(unittest.TestCase):
    def test_a_token_model(self):
        from fastai.data.core import Datasets
        from fastai.learner import Learner
        from fastai.losses import CrossEntropyLossFlat

        import fp16audit.fastai  # noqa: F401

        class Bag(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(64, 16)
                self.head = nn.Linear(16, 3)

            def forward(self, ids):
                return self.head(self.emb(ids).mean(1))

        g = torch.Generator().manual_seed(0)
        ids, labels = torch.randint(1, 64, (32, 12), generator=g), torch.randint(0, 3, (32,), generator=g)
        ds = Datasets(list(range(32)), tfms=[[lambda i: ids[i]], [lambda i: labels[i]]], splits=[list(range(24)), list(range(24, 32))])
        dls = ds.dataloaders(bs=8, num_workers=0)
        torch.manual_seed(0)
        learn = Learner(dls, Bag(), loss_func=CrossEntropyLossFlat()).to_fp16()
        r = learn.fp16audit(n_batches=2)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertEqual(r.json["inputs"][0]["kind"], "tokens")
        self.assertEqual(r.training["mode"], "train")


if __name__ == "__main__":
    unittest.main()
