"""The onnxconverter-common peer, as its README has users call it:
auto_convert_mixed_precision on the model and one batch, keeping in fp32
the fewest nodes for which the fp16 model's outputs validate against
fp32's.

    python onnxcc_amp.py model.onnx batch.npz out.onnx out.json

batch.npz holds one member per graph input, by name. Validation: the
fp16 outputs finite and within 5 % of fp32 (relative L2 error of the
whole output, as fp16audit's tolerance). out.json: whether the all-fp16
model validated, the nodes kept in fp32, and whether the search ended
with a model that validates.
"""

import json
import sys

import numpy as np
import onnx
from onnxconverter_common import auto_mixed_precision


def validate(ref, got):
    for r, g in zip(ref, got):
        if not np.issubdtype(np.asarray(r).dtype, np.floating):
            continue
        r, g = np.asarray(r, np.float64), np.asarray(g, np.float64)
        if not np.isfinite(g).all():
            return False
        if np.linalg.norm(g - r) > 0.05 * max(np.linalg.norm(r), 1e-30):
            return False
    return True


def main():
    src, batch, out_model, out_json = sys.argv[1:5]
    model = onnx.load(src)
    with np.load(batch) as z:
        feed = {k: z[k] for k in z.files}
    attempts = []
    real = auto_mixed_precision.float16.convert_float_to_float16

    def convert(m, node_block_list=None, **kw):
        attempts.append(list(node_block_list or []))
        return real(m, node_block_list=node_block_list, **kw)

    auto_mixed_precision.float16.convert_float_to_float16 = convert
    result = {"all_fp16_valid": None, "kept_fp32": None, "ok": False, "error": None}
    try:
        mixed = auto_mixed_precision.auto_convert_mixed_precision(model, feed, validate_fn=validate, keep_io_types=True)
        onnx.save(mixed, out_model)
        result.update(ok=True, kept_fp32=attempts[-1])
    except Exception as e:  # the search raises when no model validates
        result["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    # the first attempt converts every node; it is the last one tried
    # when the search keeps nothing in fp32
    result["all_fp16_valid"] = bool(result["ok"] and attempts and not attempts[-1])
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
