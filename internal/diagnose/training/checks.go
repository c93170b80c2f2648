package training

import "fp16audit/checks"

// fp16Policies are the policies under which a gradient can overflow or
// flush in 16 bits: bf16 has fp32's exponent range.
var fp16Policies = []string{"autocast-fp16", "half"}

// The checks of the training audit, FP6xxx: what a training step does that
// an inference pass cannot show — BatchNorm's statistics, the scaled loss
// gradient and the backward pass. They have a range of their own because
// they are predictions about training made before it starts, from a
// generated backward graph, where FP5xxx reads a training run's log after
// the fact. Each has its analyzer in analyzers.go.
var (
	checkBNStats = checks.Register(&checks.Check{ID: "FP6001", Title: "batchnorm running statistics look untrained", Severity: checks.SevWarning, Doc: `BatchNormalization nodes hold running statistics at their defaults (mean
0, variance 1: never updated) or one momentum update away from them (every
variance at least ONNX's momentum, and the batch that update implies of the
audited batch's scale; never under PyTorch's momentum 0, ONNX's 1, which no
update moves: a frozen pretrained BatchNorm), what a training-mode export
of an untrained model stores, while this batch is far from what they
expect. An eval-mode
audit normalizes with those statistics — the identity for an untrained
model — so activations grow layer after layer where training, which
normalizes every batch with its own statistics, keeps them small: the eval
audit can report an overflow training never hits, or miss one it does.
Audit training with --mode train on a training export:
torch.onnx.export(model, x, "model.onnx",
training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False).`})
	checkFoldedBN = checks.Register(&checks.Check{ID: "FP6002", Title: "batchnorm folded into conv by an eval export", Severity: checks.SevWarning, Doc: `Conv nodes read a weight and a bias both named onnx::Conv_<n>: the
exporter folded a BatchNorm into each of them, which torch.onnx.export does
in eval mode (torch 1.13 does it even with do_constant_folding=False). The
folded layer is BatchNorm with its running statistics; training normalizes
with each batch's statistics instead, and the folded graph cannot be turned
back into a training one (an eval export also drops Dropout). Under --mode
train this model therefore still runs with running statistics. Re-export
with training=torch.onnx.TrainingMode.TRAINING and
do_constant_folding=False to audit a training step.

torch 2.x's dynamo exporter (torch.onnx.export(dynamo=True), the default
from torch 2.9) folds too, into a Conv or Gemm that keeps the layer's
weight and carries the BatchNorm's module metadata, and it does so even
for a model in train() mode, ignoring training= (measured with torch
2.9.1): such an export computes the eval-mode forward whatever mode the
model was in. Re-export with dynamo=False and the options above.`})
	checkFP32Backward = checks.Register(&checks.Check{ID: "FP6003", Title: "fp32 backward produces nan or inf", Severity: checks.SevError, Doc: `The backward pass produces NaN/Inf even in fp32 at loss scale 1: the loss
or a gradient is not finite without any reduced precision (a loss on a
non-finite prediction, a target out of the loss's domain, a sqrt or log at
0 in the forward). No loss scale can help; fix the model, the loss or the
data first.`})
	checkSeedOverflow = checks.Register(&checks.Check{ID: "FP6004", Title: "scaled loss gradient overflows fp16 at the initial scale", Policies: fp16Policies, Severity: checks.SevInfo, Doc: `At the initial loss scale, scale × dL/dpred — the gradient the GradScaler
hands to the model's last layer, which holds its output in fp16 — exceeds
65504: the first backward is Inf and the step is skipped. fastai computes
the loss in fp32 (to_float(pred)), but the gradient flows back into fp16
at the prediction. The GradScaler halves its scale on every skipped step
(without a floor, so below 1 too) and settles at the largest scale without
overflow: the finding says where and after how many skipped steps. That
warm-up is the scaler working; whether fp16 trains the model is decided
by what the gradients lose at the settled scale (FP6007, FP6008). To skip
the warm-up pass learn.to_fp16(init_scale=2.**k) with the settled k, or
scale the targets (regression targets in their own units, a sum-reduced
loss), which gives the loss a sensible size.`})
	checkBackwardOverflow = checks.Register(&checks.Check{ID: "FP6005", Title: "backward overflows at the initial loss scale", Policies: fp16Policies, Severity: checks.SevInfo, Doc: `At the initial loss scale an activation or weight gradient of the fp16
backward overflows (the finding names the first one in backward order,
with its module) while the scaled loss gradient itself is finite. The
GradScaler skips that step and halves the scale until one is clean: the
finding says where it settles and after how many skipped steps. That
warm-up is the scaler working; what the gradients lose at the settled
scale decides whether fp16 trains the model (FP6007, FP6008). To skip it,
pass learn.to_fp16(init_scale=2.**k) with the settled k.`})
	checkOverflowEveryScale = checks.Register(&checks.Check{ID: "FP6006", Title: "backward overflows at every loss scale", Policies: fp16Policies, Severity: checks.SevError, Doc: `An fp16 gradient overflows even at the smallest loss scale judged: its
magnitude exceeds 65504 at every scale a GradScaler can reach. Use
learn.to_bf16() (bf16 has fp32's range; the report verifies it by a
rerun), keep the named module in fp32, or rescale what makes its gradient
so large (the loss, the targets, the module's output).

The emulated backward differentiates at the values the fp16 forward saved
for it, as autograd does under autocast, so the same verdict comes when
those values alone make the backward NaN/Inf at every scale while the
fp32 backward is finite: a Euclidean distance written as sqrt((d*d).sum())
between two embeddings that fp16 rounds to the same values is 0, where
sqrt's gradient is infinite. Then the loss scale is not the cause: guard
the expression (an epsilon inside the root, torch.cdist) or keep the
module in fp32.`})
	checkUnderflowEveryScale = checks.Register(&checks.Check{ID: "FP6007", Title: "gradients lose their norm at every scale that avoids overflow", Policies: fp16Policies, Severity: checks.SevError, Doc: `At the loss scale a GradScaler settles at — the largest scale at most
init_scale at which no gradient overflows — fp16 loses more than the
tolerance (1% by default, --lost-mass-tolerance) of a parameter gradient's
L2 norm, ‖fp16(g·S)/S − g‖ / ‖g‖, flushing and rounding together,
measured by an emulated fp16 backward against the fp32 one; and no larger
scale without overflow keeps it. The measure is mass, not a count of
flushed elements: the softmax tails of a confident classifier flush and
cost nothing. No GradScaler setting trains these parameters in fp16, and
training plateaus above the fp32 baseline. Tiny gradients next to large
ones come from tiny branch scales (LayerScale gammas, zero-initialized
residual branches), from a normalization dividing the gradient by a
large batch variance (unnormalized inputs before BatchNorm), or from a
very deep stack of saturating activations. Use learn.to_bf16() (Ampere
or newer; the report verifies it by the same measure) or keep the named
modules in fp32 with torch.autocast(device_type="cuda", enabled=False).`})
	checkUnderflowAtInit = checks.Register(&checks.Check{ID: "FP6008", Title: "gradients lose their norm at the initial loss scale", Policies: fp16Policies, Severity: checks.SevWarning, Doc: `At the initial loss scale, where the GradScaler stays because nothing
overflows, fp16 loses more than the tolerance of a parameter gradient's
L2 norm (mass lost, --lost-mass-tolerance), but a larger scale that keeps
the backward finite keeps it. The GradScaler grows the scale only after
2000 clean steps (growth_interval), so the first thousands of steps lose
these gradients. Start from the scale the report gives:
learn.to_fp16(init_scale=2.**k).`})
	checkNoGradRule = checks.Register(&checks.Check{ID: "FP6009", Title: "backward audit skips ops without a gradient rule", Severity: checks.SevInfo, Doc: `Some nodes have an op fp16audit has no gradient rule for (the gradient
rule column of the operator registry, docs/reference/ops.md: ConvTranspose,
RNNs, Einsum, Resize, GroupNormalization, InstanceNormalization, PRelu,
Max/Min, CumSum, Scatter, trig ops...). The
backward stops at them: the gradients of the nodes before them are left
out (or partial where another path reaches them), and the audit covers the
rest of the graph. The finding lists the nodes and what they cut off.`})
)
