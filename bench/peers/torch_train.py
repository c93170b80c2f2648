"""The PyTorch alternative to fp16audit's training audit: one training
step as torch.amp trains it, with hooks that say where the gradients go
non-finite.

    python torch_train.py model.pt args.npz target.npy classes|lm out.json

The model (torch.save(model)) runs in train() mode under
torch.autocast("cpu", dtype=torch.float16); the loss is cross-entropy on
its fp32 logits (lm: each position against the next token, as
labels=input_ids); a GradScaler at its default initial scale scales it
before backward; full backward hooks on every module record the first
module, in backward order, whose output gradient holds NaN/Inf (a hook
on each module's output tensor: full backward hooks refuse the in-place
ReLUs of torchvision's ResNet). out.json: the loss, whether the scaler
skipped the step, that module.
"""

import json
import sys
import warnings

import numpy as np
import torch
from torch.nn import functional as F


def main():
    model_path, args_path, target_path, kind, out_path = sys.argv[1:6]
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    model = torch.load(model_path, weights_only=False).train()
    with np.load(args_path) as z:
        args = [torch.from_numpy(z["arg%d" % i]) for i in range(len(z.files))]
    target = torch.from_numpy(np.load(target_path))
    first = []

    def on_grad(name):
        def f(g):
            if not first and not bool(torch.isfinite(g).all()):
                first.append(name)
        return f

    def hook(name):
        def f(mod, inp, out):
            for t in (out if isinstance(out, (tuple, list)) else [getattr(out, "logits", out)]):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(on_grad(name))
        return f

    for n, m in model.named_modules():
        if n:
            m.register_forward_hook(hook(n))
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(*args)
    logits = getattr(out, "logits", out).float()
    if kind == "lm":
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))
    else:
        loss = F.cross_entropy(logits, target)
    scaler.scale(loss).backward()
    scale = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    with open(out_path, "w") as f:
        json.dump({"loss": float(loss), "scale": scale, "skipped": scaler.get_scale() < scale,
                   "first_nonfinite_grad_module": first[0] if first else None}, f, indent=1)


if __name__ == "__main__":
    main()
