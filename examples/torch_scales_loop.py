"""Record a plain PyTorch mixed-precision run for `fp16audit scales`.

The loop below is the standard torch.autocast + GradScaler recipe with two
extra lines after scaler.update(): the loss of the step and
scaler.get_scale(). A backoff (a skipped step) shows as the scale halving
from one step to the next. The log is JSON, or CSV when the file name ends
in .csv (columns step,epoch,loss,scale).

    python torch_scales_loop.py --out run.json          # fp16 with GradScaler (needs CUDA)
    python torch_scales_loop.py --out fp32.json --fp32  # the fp32 baseline
    fp16audit scales run.json --baseline fp32.json

The model and data are synthetic so the script runs as it is; put your own
in make_model() and make_loader(). Without CUDA the scaler is disabled and
only the losses are recorded.
"""

import argparse
import csv
import json

import torch
from torch import nn


def make_model():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def make_loader(n=2048, batch_size=64):
    x = torch.randn(n, 32)
    y = (x[:, :10].argmax(dim=1)).long()
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True)


def write_log(path, log):
    "Write the log as fp16audit reads it: JSON (NaN written bare) or CSV."
    if path.endswith(".csv"):
        spe = log["steps_per_epoch"]
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            cols = ["step", "epoch", "loss"] + (["scale"] if "scales" in log else [])
            w.writerow(cols)
            for i, loss in enumerate(log["losses"]):
                row = [i, i // spe, repr(loss)]
                if "scales" in log:
                    row.append(repr(log["scales"][i]))
                w.writerow(row)
    else:
        with open(path, "w") as f:
            json.dump(log, f, allow_nan=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="scales.json", help="log to write (.json or .csv)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--fp32", action="store_true", help="train in fp32: the baseline (losses only)")
    args = p.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    use_amp = device == "cuda" and not args.fp32
    model = make_model().to(device)
    loader = make_loader()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_func = nn.CrossEntropyLoss()
    # PyTorch's defaults: init_scale 2**16, growth_factor 2, backoff_factor
    # 0.5, growth_interval 2000. torch >= 2.3 spells it torch.amp.GradScaler("cuda").
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

    log = {"steps_per_epoch": len(loader), "losses": []}
    if scaler.is_enabled():
        log["grad_scaler"] = {
            "init_scale": scaler.get_scale(),  # before the first step: the initial scale
            "growth_factor": scaler.get_growth_factor(),
            "backoff_factor": scaler.get_backoff_factor(),
            "growth_interval": scaler.get_growth_interval(),
        }
        log["scales"] = []

    for _ in range(args.epochs):
        model.train()
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad(set_to_none=True)
            # (CPU autocast accepts only bfloat16, even when disabled.)
            with torch.autocast(device_type=device, dtype=torch.float16 if use_amp else torch.bfloat16, enabled=use_amp):
                loss = loss_func(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped when the gradients hold Inf/NaN
            scaler.update()  # halves the scale on a skip, doubles it after growth_interval clean steps
            log["losses"].append(loss.item())
            if scaler.is_enabled():
                log["scales"].append(scaler.get_scale())

    write_log(args.out, log)
    print(f"{len(log['losses'])} steps written to {args.out}")


if __name__ == "__main__":
    main()
