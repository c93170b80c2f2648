"""The models Hugging Face users fine-tune, audited against PyTorch's own run.

Random-init models from configs at real architectures' widths, heads and
norms (t5-small, SmolLM2-135M's Llama, Qwen2.5-0.5B, gemma-3-270m,
bert-base; two layers and a small vocabulary), saved and loaded back with
from_pretrained(dtype=...) as users load checkpoints. PyTorch's truth is
computed beside each audit: the model run as loaded (float16 weights, with
transformers' _keep_in_fp32_modules kept in float32) or under CPU autocast
fp16 (torch 2.x's real fp16 kernels), against the float32 model.
"""

import tempfile
import unittest
import warnings

import support
import torch

import fp16audit
from fp16audit._trainers import exportable

TOL = 0.05  # the binary's default fp16 output tolerance


def setUpModule():
    support.require_trainers("transformers", "peft")
    warnings.filterwarnings("ignore")
    import transformers

    # the loaders' progress bars and notices are not the tests' output
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def rel_err(out, ref):
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def scale_output(module, run, peak):
    """Scale module's weight so that its output peaks at peak on run()."""
    seen = {}
    h = module.register_forward_hook(lambda mod, i, o: seen.__setitem__("y", o))
    with torch.no_grad():
        run()
        module.weight.mul_(peak / float(seen["y"].abs().max()))
    h.remove()


def reload(model, dtype):
    """model saved and loaded back with from_pretrained(dtype=dtype), as a checkpoint is."""
    with tempfile.TemporaryDirectory(prefix="fp16audit-hf-") as d:
        model.save_pretrained(d)
        return type(model).from_pretrained(d, dtype=dtype).eval()


def audit(model, batch, policy):
    with exportable(model) as m:
        return fp16audit.audit(m, batch, policy=policy, progress=False)


class KeepInFP32Test(unittest.TestCase):
    """T5 sets _keep_in_fp32_modules = ["wo"]: from_pretrained(dtype=torch.float16)
    keeps every wo in float32, and T5 casts wo's input to wo's dtype."""

    @classmethod
    def setUpClass(cls):
        from transformers import T5Config, T5EncoderModel

        torch.manual_seed(0)
        cfg = T5Config(d_model=512, d_ff=2048, d_kv=64, num_heads=8, num_layers=2, vocab_size=256, use_cache=False)
        m = T5EncoderModel(cfg).eval()
        cls.ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
        # block 0's feed-forward output at 1e5, as trained T5 checkpoints emit
        scale_output(m.encoder.block[0].layer[1].DenseReluDense.wo, lambda: m(cls.ids), 1.0e5)
        cls.fp32 = m
        cls.ref = m(cls.ids).last_hidden_state.detach()
        cls.fp16 = reload(m, torch.float16)

    def test_transformers_keeps_wo_in_fp32(self):
        dtypes = {n: p.dtype for n, p in self.fp16.named_parameters()}
        self.assertEqual(dtypes["encoder.block.0.layer.1.DenseReluDense.wo.weight"], torch.float32)
        self.assertEqual(dtypes["encoder.block.0.layer.1.DenseReluDense.wi.weight"], torch.float16)

    def test_loaded_in_float16_it_is_healthy_as_pytorch_runs_it(self):
        # PyTorch: wo computes in float32, the residual stream goes on in
        # float32, and the outputs agree with the float32 model's
        with torch.no_grad():
            out = self.fp16(self.ids).last_hidden_state
        self.assertTrue(torch.isfinite(out).all())
        self.assertLess(rel_err(out, self.ref), TOL)
        # the audit of the model as loaded, under half (its run as stored):
        # before the stored float32 weights were kept, wo was held in fp16
        # and called an overflow
        r = audit(self.fp16, {"input_ids": self.ids}, "half")
        self.assertEqual(r.verdict, "healthy", r.verdict_text)

    def test_under_autocast_wo_overflows(self):
        # fp16=True in the Trainer: the float32 model under autocast, where
        # wo is an fp16 op whatever _keep_in_fp32_modules says
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            out = self.fp32(self.ids).last_hidden_state
        self.assertFalse(torch.isfinite(out).all())
        r = audit(self.fp32, {"input_ids": self.ids}, "autocast-fp16")
        self.assertEqual(r.verdict, "overflowing-op")
        self.assertEqual(r.modules[0], "encoder.block.0.layer.1.DenseReluDense.wo")


def llama_like(arch):
    """(model, input ids, the down_proj to plant) at a real architecture's shapes."""
    import transformers as tf

    torch.manual_seed(1)
    common = dict(vocab_size=256, num_hidden_layers=2, max_position_embeddings=64, use_cache=False)
    if arch == "llama":  # SmolLM2-135M
        m = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                                               rms_norm_eps=1e-5, **common))
    elif arch == "qwen2":  # Qwen2.5-0.5B
        m = tf.Qwen2ForCausalLM(tf.Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                                               rms_norm_eps=1e-6, **common))
    else:  # gemma-3-270m
        m = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
                                                     head_dim=256, rms_norm_eps=1e-6, sliding_window=512, **common))
    m.eval()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    return m, ids, m.model.layers[0].mlp.down_proj


class PEFTTest(unittest.TestCase):
    """LoRA on a frozen base stored in float16, adapters in float32, as
    from_pretrained(dtype=torch.float16) + get_peft_model leave them; the
    Trainer's fp16=True runs it under autocast."""

    def lora(self, arch, planted):
        from peft import LoraConfig, get_peft_model

        m, ids, down = llama_like(arch)
        if planted:
            # a massive activation: layer 0's down_proj output at 1.5e5
            scale_output(down, lambda: m(ids), 1.5e5)
        base = reload(m, torch.float16)
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
        return m, model, ids

    def check(self, arch):
        ref_model, model, ids = self.lora(arch, planted=True)
        trainable = {p.dtype for p in model.parameters() if p.requires_grad}
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
        self.assertEqual(trainable, {torch.float32})
        self.assertEqual(frozen, {torch.float16})
        # PyTorch under CPU autocast fp16: the planted down_proj is Inf
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            out = model(input_ids=ids).logits
        self.assertFalse(torch.isfinite(out).all())
        r = audit(model, {"input_ids": ids}, "autocast-fp16")
        self.assertEqual(r.verdict, "overflowing-op", r.verdict_text)
        self.assertEqual(r.modules[0], "model.layers.0.mlp.down_proj")
        # the healthy one: finite and close under autocast, and audited so
        _, model, ids = self.lora(arch, planted=False)
        with torch.no_grad():
            ref = model(input_ids=ids).logits.float()
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(input_ids=ids).logits
        self.assertTrue(torch.isfinite(out).all())
        self.assertLess(rel_err(out, ref), TOL)
        r = audit(model, {"input_ids": ids}, "autocast-fp16")
        self.assertEqual(r.verdict, "healthy", r.verdict_text)

    def test_llama(self):
        self.check("llama")

    def test_qwen2(self):
        self.check("qwen2")

    def test_gemma3(self):
        self.check("gemma3")


class BertTest(unittest.TestCase):
    def test_bert_base_shapes_healthy_under_autocast(self):
        import transformers as tf

        torch.manual_seed(2)
        m = tf.BertModel(tf.BertConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=2,
                                       vocab_size=256, max_position_embeddings=64), add_pooling_layer=False).eval()
        ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
        mask = torch.ones_like(ids)
        mask[1, 10:] = 0
        with torch.no_grad():
            ref = m(input_ids=ids, attention_mask=mask).last_hidden_state
            with torch.autocast("cpu", dtype=torch.float16):
                out = m(input_ids=ids, attention_mask=mask).last_hidden_state
        self.assertLess(rel_err(out, ref), TOL)
        r = audit(m, {"input_ids": ids, "attention_mask": mask}, "autocast-fp16")
        self.assertEqual(r.verdict, "healthy", r.verdict_text)


class FrontDoorTest(unittest.TestCase):
    def test_a_causal_lm_with_its_cache_on_audits_from_the_notebook(self):
        # GPT-2's config has use_cache=True, and its forward then returns
        # transformers' DynamicCache, which neither exporter can write:
        # audit() itself turns the cache off for the export and back on.
        import transformers as tf

        torch.manual_seed(3)
        m = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                             bos_token_id=0, eos_token_id=0)).eval()
        self.assertTrue(m.config.use_cache)
        ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            ref = m(input_ids=ids).logits
            with torch.autocast("cpu", dtype=torch.float16):
                out = m(input_ids=ids).logits
        self.assertLess(rel_err(out, ref), TOL)
        r = fp16audit.audit(m, {"input_ids": ids}, progress=False)
        self.assertEqual(r.verdict, "healthy", r.verdict_text)
        self.assertTrue(m.config.use_cache)
        # the training audit with the model's own loss target: dropout 0.1
        # in every block, the backward's runs dropping the same elements
        r = fp16audit.audit(m, {"input_ids": ids, "labels": ids}, loss="cross-entropy", progress=False)
        self.assertEqual(r.training["backward"]["verdict"], "healthy", r.training["backward"]["verdict_text"])
        self.assertTrue(m.config.use_cache)
        self.assertFalse(m.training)

if __name__ == "__main__":
    unittest.main()
