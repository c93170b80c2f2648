"""The PyTorch peer: what a user writes to find where fp16 goes wrong,
forward hooks on every module and a run under real fp16 CPU kernels.

    python torch_hooks.py model.pt batch.npz out.json

model.pt is the whole nn.Module (torch.save(model)), batch.npz one
member per forward argument, in order (arg0, arg1, ...). The model runs
three times: in fp32 (the reference), under torch.autocast("cpu",
dtype=torch.float16) and after model.half() (float inputs cast to half).
Each fp16 run records, through forward hooks, the first module whose
output holds NaN/Inf while its inputs are finite (the innermost first:
a module's hook fires after its children's), and compares the outputs
with fp32's (relative L2 error of the worst sample). out.json holds what
each run found, the fp32 run's NaN/Inf too.
"""

import copy
import json
import sys
import warnings

import numpy as np
import torch


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    if hasattr(x, "to_tuple"):  # a transformers ModelOutput
        return tensors(x.to_tuple())
    return []


def finite(ts):
    return all(bool(torch.isfinite(t).all()) for t in ts if t.is_floating_point())


def run(model, args, mode):
    first = []

    def hook(name):
        def f(mod, inp, out):
            if not first and finite(tensors(inp)) and not finite(tensors(out)):
                first.append((name, type(mod).__name__))
        return f

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            if mode == "autocast":
                with torch.autocast("cpu", dtype=torch.float16):
                    out = model(*args)
            else:
                out = model(*args)
        error = None
    except RuntimeError as e:
        out, error = None, str(e).splitlines()[0]
    finally:
        for h in handles:
            h.remove()
    return out, first[0] if first else None, error


def worst_rel_err(ref, out):
    worst = 0.0
    for r, o in zip(tensors(ref), tensors(out)):
        if not r.is_floating_point():
            continue
        r, o = r.double().flatten(1) if r.dim() > 1 else r.double()[:, None], o.double().flatten(1) if o.dim() > 1 else o.double()[:, None]
        num = (o - r).norm(dim=1)
        den = r.norm(dim=1).clamp(min=1e-30)
        worst = max(worst, float((num / den).max()))
    return worst


def main():
    model_path, batch_path, out_path = sys.argv[1:4]
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    model = torch.load(model_path, weights_only=False).eval()
    with np.load(batch_path) as z:
        args = [torch.from_numpy(z["arg%d" % i]) for i in range(len(z.files))]
    ref, ref_first, _ = run(model, args, "fp32")
    result = {"fp32": {"outputs_nonfinite": ref is not None and not finite(tensors(ref)),
                       "first_nonfinite_module": ref_first[0] if ref_first else None}}
    for mode in ("autocast", "half"):
        m, a = model, args
        if mode == "half":
            m = copy.deepcopy(model).half()
            a = [x.half() if x.is_floating_point() else x for x in args]
        out, first, error = run(m, a, mode)
        nonfinite = out is not None and not finite(tensors(out))
        err = None if out is None or nonfinite else worst_rel_err(ref, out)
        result[mode] = {"outputs_nonfinite": nonfinite, "worst_rel_err": err, "raised": error,
                        "first_nonfinite_module": first[0] if first else None,
                        "first_nonfinite_class": first[1] if first else None}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
