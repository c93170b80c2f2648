"""Export the two benchmark models of package ortstats with PyTorch.

Command (Debian's python3-torch 1.13 and python3-onnx live under
/usr/bin/python3, not the pyenv python first on PATH):

    /usr/bin/python3 ortstats/testdata/export.py

Made with torch 1.13.0a0, onnx 1.12.0 on CPU; CI never runs this script and
its outputs are committed beside it:

    transformer.onnx  nn.TransformerEncoder, 2 layers, d_model 64, 4 heads,
                      feed-forward 256, batch_first, eval mode, opset 14;
                      input "x" [batch, seq, 64], output "y"
    resnet.onnx       a ResNet-18-shaped CNN (BasicBlocks [2,2,2,2], widths
                      16-32-64-128) with a 10-class head, opset 14; input
                      "x" [batch, 3, H, W], output "logits"

Batches are not committed: the benchmark draws them from a fixed seed.
"""

import os

import onnx
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with a residual sum."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        skip = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + skip)


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            blocks += [Block(cin, w, stride), Block(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def export(model, example, name, inp, out, axes):
    path = os.path.join(HERE, name + ".onnx")
    torch.onnx.export(model, (example,), path, opset_version=14, input_names=[inp], output_names=[out],
                      dynamic_axes=axes, do_constant_folding=True)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    print(path, "torch", torch.__version__, "nodes", len(m.graph.node))


def main():
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True), 2)
    enc.eval()
    export(enc, torch.randn(2, 16, 64), "transformer", "x", "y", {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}})

    net = ResNet()
    net.train()
    with torch.no_grad():  # running statistics of their own, as training would give
        for _ in range(10):
            net(torch.randn(8, 3, 32, 32))
    net.eval()
    export(net, torch.randn(2, 3, 32, 32), "resnet", "x", "logits", {"x": {0: "batch"}, "logits": {0: "batch"}})


if __name__ == "__main__":
    main()
