"""The safetensors format, written and read without the safetensors package.

A file is an 8-byte little-endian header length, a JSON header mapping each
tensor's name to its dtype, shape and [begin, end) byte offsets into the
data that follows, then the raw little-endian data. Nothing in it is code:
a reader only slices bytes, which is why a capture stores its tensors so.
The optional "__metadata__" entry maps strings to strings.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any, BinaryIO, Dict, Mapping, Optional, Tuple

import numpy as np

# torch dtype name -> (safetensors dtype, bytes per element)
_DTYPES = {
    "float64": ("F64", 8), "float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2),
    "int64": ("I64", 8), "int32": ("I32", 4), "int16": ("I16", 2), "int8": ("I8", 1), "uint8": ("U8", 1), "bool": ("BOOL", 1),
}
_NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
          "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.int16}
_SIZES = {v[0]: v[1] for v in _DTYPES.values()}
# A header larger than this is not a header (the safetensors package caps it at 100 MB too).
_MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    """A file that is not valid safetensors; the message names the file and what is wrong."""


def _bytes_of(t: Any) -> Tuple[str, Tuple[int, ...], Any]:
    """(safetensors dtype, shape, a buffer of the raw data) of a torch tensor, copied to the host only when it is not there."""
    import torch

    t = t.detach()
    name = str(t.dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise SafetensorsError("a %s tensor has no safetensors dtype here" % name)
    shape = tuple(t.shape)
    t = t.to("cpu").contiguous().reshape(-1)
    # bfloat16 has no numpy dtype: its bytes are written as they are.
    raw = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return _DTYPES[name][0], shape, raw.numpy()


def write(f: BinaryIO, tensors: Mapping[str, Any], metadata: Optional[Mapping[str, str]] = None) -> int:
    """Write torch tensors to the open binary file f; returns the bytes written."""
    if sys.byteorder != "little":  # pragma: no cover - no big-endian machine runs torch's wheels
        raise SafetensorsError("writing safetensors on a big-endian machine is not supported")
    header: Dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    parts = []
    offset = 0
    # Wider elements first: every tensor then starts at a multiple of its
    # element size (the data starts 8-aligned), so a reader may map the file
    # and use a tensor in place (the capture's ONNX model points into it).
    items = sorted(((name, _bytes_of(t)) for name, t in tensors.items()), key=lambda kv: -_SIZES[kv[1][0]])
    for name, (dtype, shape, raw) in items:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + raw.nbytes]}
        parts.append(raw)
        offset += raw.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # The data starts on an 8-byte boundary, as the safetensors package writes it.
    text += b" " * (-len(text) % 8)
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for raw in parts:
        f.write(memoryview(raw).cast("B") if raw.nbytes else b"")
    return 8 + len(text) + offset


def read(path: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Read a safetensors file into torch tensors (on the CPU); returns (tensors, metadata)."""
    import torch

    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SafetensorsError("%s: %d bytes, shorter than the 8-byte header length" % (path, len(data)))
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise SafetensorsError("%s: the header claims %d bytes, the file holds %d after the length: truncated or not safetensors" % (path, n, len(data) - 8))
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError("%s: the header is not JSON (%s)" % (path, e)) from None
    if not isinstance(header, dict):
        raise SafetensorsError("%s: the header is not a JSON object" % path)
    meta = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + n:]
    out = {}
    for name, e in header.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], [int(d) for d in e["shape"]], e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError("%s: tensor %r: want dtype, shape and data_offsets" % (path, name)) from None
        if dtype not in _NUMPY:
            raise SafetensorsError("%s: tensor %r: dtype %r is not one this reader knows (%s)" % (path, name, dtype, ", ".join(_NUMPY)))
        count = 1
        for d in shape:
            if d < 0:
                raise SafetensorsError("%s: tensor %r: negative dimension in %s" % (path, name, shape))
            count *= d
        if not (0 <= begin <= end <= len(body)) or end - begin != count * _SIZES[dtype]:
            raise SafetensorsError("%s: tensor %r: offsets [%d, %d) do not hold %d x %s elements of shape %s in %d bytes of data: truncated?" % (
                path, name, begin, end, count, dtype, shape, len(body)))
        a = np.frombuffer(body[begin:end], dtype=_NUMPY[dtype]).reshape(shape)
        t = torch.from_numpy(a.copy())
        if dtype == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t
    return out, {str(k): str(v) for k, v in meta.items()}
