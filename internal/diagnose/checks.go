package diagnose

import (
	"fp16audit/checks"
)

// The checks of the dynamic audit. Their IDs are stable; see package checks.
// Each has its analyzer in analyzers.go.
var (
	checkPoisonedInput = checks.Register(&checks.Check{ID: "FP1001", Title: "input holds nan or inf", Severity: checks.SevError, Doc: `The batch itself contains NaN or ±Inf values. Every pass, fp32 included,
propagates them, so no precision setting can help: the loss is NaN from the
first step. Find the source in the data pipeline (division by a zero
standard deviation, log of zero, missing values read as NaN) and clean or
impute it before training.`})
	checkInputRange = checks.Register(&checks.Check{ID: "FP1002", Title: "input beyond the fp16 range", Severity: checks.SevError, Doc: `An input holds values with |x| > 65504, the largest fp16 number. Under
autocast-fp16 the first lower-precision op (Conv, MatMul, Linear) casts its
input to fp16, and under half the input itself is fp16: such values are Inf
there. Scale the input, for example with fastai's Normalize or by
standardizing the column. The same check reports a batch saved in float16
that holds ±Inf but no NaN (under every policy): values beyond 65504 became
Inf when it was saved, which is unnormalized data rather than poisoned
data.`})
	checkRawPixels = checks.Register(&checks.Check{ID: "FP1003", Title: "input looks like raw pixels", Severity: checks.SevWarning, Doc: `An image-like input holds raw pixels, not normalized ones: integers in
0..255 as decoded, or floats that stay within 0..255 and spread over much
of it, every channel's mean well inside it, as a resized or augmented
batch leaves them (decided by range and spread, not by integrality). Activations grow with the input scale; a network trained
on normalized data overflows fp16 when fed raw pixels. In fastai add
IntToFloatTensor and Normalize.from_stats(mean, std) (the report prints the
statistics of the batch), in plain PyTorch transforms.Normalize.`})
	checkUnscaledColumns = checks.Register(&checks.Check{ID: "FP1004", Title: "tabular columns far from standardized", Severity: checks.SevWarning, Doc: `A 2-D (rows × columns) input has columns whose mean or spread is far from
a standardized column (|mean| > 10 or std > 10): typically prices, counts or
timestamps fed as they are. Large inputs make large activations; fastai's
Normalize proc for tabular data, or (x − mean)/std per column, fixes it.`})
	checkConstantInput = checks.Register(&checks.Check{ID: "FP1005", Title: "input holds one value everywhere", Severity: checks.SevWarning, Doc: `Every element of a float input is the same value (all zeros, a fill
value): the audit then sees activations no real batch makes, and a clean
result says nothing about training. Save real samples, e.g. xb[:8] from
learn.dls.one_batch().`})
	checkUnscaledSignal = checks.Register(&checks.Check{ID: "FP1006", Title: "float input far from standardized", Severity: checks.SevWarning, Doc: `A float input that is not an image or a table — a waveform, sequence
features, any other signal — has channels whose mean or spread is far from
standardized (|mean| > 10 or std > 10), such as 16-bit audio samples in
±32768. Large inputs make large activations that overflow fp16. Standardize
it ((x − mean)/std, or x / 32768 for 16-bit audio); the report gives the
statistics and whether a rerun with standardized inputs is clean.`})

	checkOverflow = checks.Register(&checks.Check{ID: "FP2001", Title: "op overflows in fp16", Severity: checks.SevError, Doc: `In the emulated fp16 pass this node is where NaN/Inf first appear: its
output holds non-finite values while all of its inputs are finite. In fp32
the same output is finite, but its magnitude exceeds 65504 (fp16's max), so
the fp16 result is Inf and everything downstream becomes NaN. The report
gives the fp32 max |x| and the fix that a rerun verified: standardized
inputs, to_bf16(), or keeping the listed modules in fp32 with
torch.autocast(device_type="cuda", enabled=False). Lowering GradScaler's
init_scale does not help: the scaler only touches gradients.`})
	checkFP32Broken = checks.Register(&checks.Check{ID: "FP2002", Title: "fp32 pass produces nan or inf", Severity: checks.SevError, Doc: `The model produces NaN/Inf even in full fp32 precision on this batch (the
reference pass runs a truly fp32 graph: explicit half casts are promoted).
This is not a mixed-precision problem: fix the model (log of zero,
division by zero, exp of a large value, sqrt of a negative) or the data
first; mixed precision only makes it worse.`})
	checkLogits = checks.Register(&checks.Check{ID: "FP2003", Title: "oversized logits overflow fp16", Severity: checks.SevError, Doc: `The overflow starts in the model's final layer: the last lower-precision op
before a graph output, followed at most by shape ops, activations or
softmax. Its fp32 output exceeds 65504. Logits that large come from an
unscaled final layer (initialisation, a missing normalization before the
head) or a target scale the model learned to match; fastai casts the
predictions to fp32 only after the layer has already overflowed. Scale the
head's input (LayerNorm/BatchNorm before it), re-initialise it, rescale the
targets, or keep the head in fp32.`})
	checkAbsorbed = checks.Register(&checks.Check{ID: "FP2005", Title: "nan or inf absorbed before the outputs", Severity: checks.SevWarning, Doc: `NaN/Inf appear at this node in the pass, but no graph output holds them:
an op on the way absorbs them (softmax of -Inf is 0, max and where pick
the other value, a product with zero), and the outputs still agree with
fp32's within the tolerance (an absorbed overflow that leaves them wrong,
such as rsqrt(inf) = 0, is an error: FP2006 and the origin's check). The
outputs are what the loss sees, so this is not what makes a loss NaN —
but an Inf in an intermediate value is one step from NaN: a fully masked
softmax row, an Inf minus an Inf, or the backward pass through it. Check
that the values are meant to be infinite (a mask) and that every row
keeps a finite entry.`})
	checkWrongOutputs = checks.Register(&checks.Check{ID: "FP2006", Title: "outputs finite but wrong", Severity: checks.SevError, Doc: `The emulated pass's graph outputs hold no NaN/Inf, yet they differ from
the fp32 outputs by more than the format's rounding explains: the worst
sample's relative L2 error ‖y − y32‖/‖y32‖ exceeds the tolerance
(--output-tolerance; by default 5% for fp16 and 25% for bf16, the largest
errors of healthy models with a margin). Typically an overflow was
absorbed on the way: a hand-written LayerNorm whose (x − mean)² overflows
gives rsqrt(inf) = 0 and the normalized activations collapse to the bias,
F.normalize whose sum of squares overflows divides by Inf. The loss is
finite, so training runs on and learns from wrong predictions. The finding
gives the errors and the top-1 agreement of class scores; the origin
(FP2001, FP2003 or FP4001) is the overflow whose effect reaches the
output, and the fixes are judged by whether their outputs agree with fp32
again. When nothing overflows, the origin is the first value whose error
exceeds the tolerance while its inputs agree: keep it in fp32.`})
	checkHeadroom = checks.Register(&checks.Check{ID: "FP2004", Title: "little fp16 headroom", Severity: checks.SevWarning, Doc: `A value held in fp16 has a fp32 max |x| within a few bits of 65504
(headroom = log2(65504 / max|x|) below the threshold, 3 bits by default).
It does not overflow on these batches, but a batch with larger inputs, or
weights that grow during training, will. Audit a later checkpoint, or keep
that module in fp32.`})
	checkUnderflow = checks.Register(&checks.Check{ID: "FP3001", Title: "values flush to zero in fp16", Severity: checks.SevWarning, Doc: `A large fraction of the nonzero fp32 values of this tensor become zero
when held in fp16 (|x| ≤ 2^-25), beyond the threshold (10% by default).
Information is lost in the forward pass; training may plateau above the
fp32 baseline. to_bf16() keeps fp32's range; otherwise rescale the layer.`})
	checkPrecisionLoss = checks.Register(&checks.Check{ID: "FP3002", Title: "rounding to fp16 corrupts the outputs", Severity: checks.SevError, Doc: `Nothing overflows and nothing underflows in the emulated pass, yet its
graph outputs are finite and wrong (FP2006), and this node is where the
error starts: its output differs from fp32's beyond the tolerance while
every value it reads agrees. The values stay within the format's range;
what is lost are significant digits (fp16 keeps 11, bf16 8): a sum of
large and small terms, a difference of nearly equal values, a product
that amplifies the error of its operands, an input far from standardized
whose small variations vanish next to its magnitude. It differs from
forward underflow (values below the smallest normal, flushed to zero)
and from an overflow absorbed on the way (FP2001 with FP2006). The fixes
are verified by reruns: keeping the node and what follows it in fp32
(torch.autocast(device_type="cuda", enabled=False) around the module),
standardized inputs where an input is flagged, to_bf16() where the bf16
pass agrees with fp32.`})
	checkHalfCast = checks.Register(&checks.Check{ID: "FP4001", Title: "explicit half cast overflows", Severity: checks.SevError, Doc: `The graph casts a value to fp16 itself (user code such as x.half() exports
as Cast(to=FLOAT16)), and that value overflows: at the Cast, or at an op
downstream whose input came through the cast (f = h.half(); g = f * f),
also where autocast or model.half() would hold the value in fp16 anyway
(fc(x).half()), and the same value overflows with mixed precision off (the
as-written pass: plain fp32 but for the model's own casts), so switching
to_fp16() off does not help. An overflow that only autocast's lower
precision causes, with a cast upstream, is FP2001 instead. The finding
names the cast and the op that overflows; the report verifies whether
removing the cast removes the overflow, and where autocast still holds
the op in fp16 without it, which modules to keep in fp32 as well. Remove the cast,
move it after the op that overflows, scale before it, or clamp
(x.clamp(-65504, 65504).half()).`})
)
