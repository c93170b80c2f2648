"""The batch axis of each input and output of an audited model, and the dynamic axes of its export.

Axis 0 is the batch axis of most inputs, not of all: a recurrent model's
state in PyTorch's layout is (num_layers * directions, B, H), a
sequence-first model (nn.LSTM, nn.GRU, nn.MultiheadAttention,
nn.Transformer* with batch_first=False, their default) takes (T, B, F).
Marking axis 0 of those as the batch makes the binary refuse the batch
(two inputs' "batch" disagree), split a batch along time (the batch run
in parts under --max-memory, the samples counted along T), or feed ONNX
Runtime shapes the trace never saw ("Gather ... indices element out of
data bounds"), and torch.export refuses a dynamic hint on an axis it
traces as a constant.

So each input's batch axis is inferred: B is the size the target's first
axis has, else the size every input shares, else the first input's
first axis; each input's batch axis is its axis of size B, axis 0 first
(axis 1 first in a sequence-first model). Where that is not the plain
convention (every input's axis 0, no sequence-first layer), the model is
run once on one sample, cut along the inferred axes: the batch axes are
the ones along which the sample's outputs are the full batch's, and each
output's batch axis is the axis that shrank to 1. Without such an
assignment the export is static. The user can say it instead:
batch_axes= (an axis for every input, or per input by name; None for no
batch axis) or dynamic_axes= (torch.onnx.export's form, taken as given).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

BatchAxes = Union[None, int, Mapping[str, Optional[int]], Sequence[Optional[int]]]


class Axes:
    """The batch axis of each input and output (None: none) and the
    dynamic axes the export is asked for. made_up: the front door inferred
    them (the user did not say); varying: some axis differs between the
    batches drawn (a static export cannot serve them all); how: how they
    were decided, in words."""

    def __init__(self, batch: Dict[str, Optional[int]], dynamic: Dict[str, Dict[int, str]], made_up: bool, varying: bool, how: str):
        self.batch = batch
        self.dynamic = dynamic
        self.made_up = made_up
        self.varying = varying
        self.how = how

    def describe(self) -> str:
        """The assumptions in words: the batch axes, and the dynamic axes."""
        dyn = "; ".join("%s %s" % (n, ", ".join("%d=%s" % (k, v) for k, v in sorted(d.items())))
                        for n, d in self.dynamic.items() if d) or "none (static shapes)"
        return "batch axes %s (%s); dynamic axes: %s" % (
            ", ".join("%s %s" % (n, "-" if a is None else a) for n, a in self.batch.items()), self.how, dyn)


def _varying(names: Sequence[str], drawn) -> Dict[str, List[int]]:
    first = drawn[0][0]
    out: Dict[str, List[int]] = {n: [] for n in names}
    for xs, _, _ in drawn[1:]:
        for n, x0, x in zip(names, first, xs):
            for k in range(x.dim()):
                if x.shape[k] != x0.shape[k] and k not in out[n]:
                    out[n].append(k)
    return out


def _sequence_first(model) -> List[str]:
    """The layers of model that take (T, B, F): recurrent layers and
    attention with batch_first=False."""
    import torch

    out = []
    for name, m in model.named_modules():
        kinds = (torch.nn.RNNBase, torch.nn.MultiheadAttention, torch.nn.Transformer, torch.nn.TransformerEncoderLayer,
                 torch.nn.TransformerDecoderLayer)
        if isinstance(m, kinds) and getattr(m, "batch_first", None) is False:
            out.append(name or type(m).__name__)
    return out


def _given(names: Sequence[str], batch_axes: BatchAxes) -> Dict[str, Optional[int]]:
    if isinstance(batch_axes, bool):
        raise TypeError("fp16audit.audit: batch_axes=%r; want an axis, a dict of input name to axis, or a list of axes" % batch_axes)
    if isinstance(batch_axes, int):
        return {n: batch_axes for n in names}
    if isinstance(batch_axes, Mapping):
        unknown = [k for k in batch_axes if k not in names]
        if unknown:
            raise ValueError("fp16audit.audit: batch_axes names %s, which %s not among the inputs (%s)" % (
                ", ".join(repr(k) for k in unknown), "is" if len(unknown) == 1 else "are", ", ".join(names)))
        return {n: batch_axes.get(n, 0) for n in names}
    seq = list(batch_axes)  # type: ignore[arg-type]
    if len(seq) != len(names):
        raise ValueError("fp16audit.audit: batch_axes has %d entries for %d inputs (%s)" % (len(seq), len(names), ", ".join(names)))
    return dict(zip(names, seq))


def _output_axis(full, small, b: int) -> Optional[int]:
    """The axis of an output that is the batch's: size b in the full
    batch's output and 1 in the one sample's, the others alike."""
    if full.dim() != small.dim() or full.dim() == 0:
        return None
    cand = [k for k in range(full.dim()) if full.shape[k] == b and small.shape[k] == 1
            and all(full.shape[j] == small.shape[j] for j in range(full.dim()) if j != k)]
    return cand[0] if len(cand) == 1 else None


def _agrees(full, small, axis: Optional[int]) -> bool:
    import torch

    if axis is None:
        return full.shape == small.shape and (not full.is_floating_point() or torch.allclose(full, small, rtol=1e-3, atol=1e-5, equal_nan=True)) \
            and (full.is_floating_point() or torch.equal(full, small))
    part = full.narrow(axis, 0, 1)
    if part.shape != small.shape:
        return False
    if not part.is_floating_point():
        return torch.equal(part, small)
    scale = float(part[torch.isfinite(part)].abs().max()) if torch.isfinite(part).any() else 0.0
    return torch.allclose(part, small, rtol=1e-3, atol=1e-5 * max(scale, 1.0), equal_nan=True)


def _check(assign: Dict[str, Optional[int]], first, names, outputs, b: int, run: Callable) -> Optional[Dict[str, Optional[int]]]:
    """Run the model on the first sample along assign's axes; the outputs'
    batch axes when every output agrees with the full batch's, else None."""
    small_in = [x.narrow(assign[n], 0, 1) if assign[n] is not None else x for n, x in zip(names, first)]
    try:
        small = run(small_in)
    except Exception:  # a model that cannot run one sample: no dynamic batch
        return None
    if len(small) != len(outputs):
        return None
    out_axes: Dict[str, Optional[int]] = {}
    for (on, full), s in zip(outputs, small):
        a = _output_axis(full, s, b)
        if not _agrees(full, s, a):
            return None
        out_axes[on] = a
    return out_axes


def plan(model, names: Sequence[str], drawn, outputs: Sequence[Tuple[str, Any]], target, batch_axes: BatchAxes = None,
         dynamic_axes: Optional[Mapping[str, Any]] = None, run: Optional[Callable] = None) -> Axes:
    """Decide the batch axes and the export's dynamic axes (module
    docstring). drawn: the batches, (inputs, target, keys) each; outputs:
    (name, tensor) of the model's outputs on the first batch; run(inputs)
    returns the outputs, flattened, on other inputs."""
    from .audit import BatchError

    first = drawn[0][0]
    varying = _varying(names, drawn)
    any_varying = any(varying.values())
    if dynamic_axes is not None:
        axes = {str(k): ({int(a): "%s_dim%d" % (k, a) for a in v} if not isinstance(v, Mapping) else {int(a): str(d) for a, d in v.items()})
                for k, v in dynamic_axes.items()}
        for n in names:
            missing = [k for k in varying[n] if k not in axes.get(n, {})]
            if missing:
                raise BatchError("fp16audit.audit: input %r's axis %s differs between the batches drawn, but dynamic_axes does not mark "
                                 "it dynamic: add it, or draw batches of one shape" % (n, ", ".join(map(str, missing))))
        batch = {n: next((a for a, d in axes.get(n, {}).items() if d == "batch"), None) for n in list(names) + [o for o, _ in outputs]}
        return Axes(batch, axes, False, any_varying, "dynamic_axes as given")

    made_up = batch_axes is None
    b = None
    if not made_up:
        given = _given(names, batch_axes)
        for n, x in zip(names, first):
            a = given[n]
            if a is not None and not -x.dim() <= a < x.dim():
                raise BatchError("fp16audit.audit: batch_axes gives input %r axis %d, but it has %d axes %s" % (n, a, x.dim(), tuple(x.shape)))
            if a is not None and a < 0:
                given[n] = a + x.dim()
        sizes = {first[i].shape[given[n]] for i, n in enumerate(names) if given[n] is not None}
        if len(sizes) > 1:
            raise BatchError("fp16audit.audit: batch_axes gives axes of different sizes (%s): a batch axis holds the same number of "
                             "samples in every input" % ", ".join("%s axis %s: %d" % (n, given[n], first[i].shape[given[n]])
                                                                  for i, n in enumerate(names) if given[n] is not None))
        assign = given
        b = sizes.pop() if sizes else None
        how = "batch_axes as given"
        out_axes = _by_size(outputs, b)
    else:
        assign, b, how, out_axes = _infer(model, names, first, outputs, target, run)
    dynamic: Dict[str, Dict[int, str]] = {}
    for n, x in zip(names, first):
        d = {k: "%s_dim%d" % (n, k) for k in varying[n]}
        a = assign.get(n)
        if a is not None:
            d[a] = "batch"
        dynamic[n] = d
    for on, a in out_axes.items():
        if a is not None:
            dynamic[on] = {a: "batch"}
    batch = dict(assign)
    batch.update(out_axes)
    return Axes(batch, {k: v for k, v in dynamic.items() if v}, made_up, any_varying, how)


def _by_size(outputs, b: Optional[int]) -> Dict[str, Optional[int]]:
    """Each output's batch axis by its size alone: axis 0 where it is b,
    else its only axis of size b."""
    out: Dict[str, Optional[int]] = {}
    for on, t in outputs:
        shape = list(t.shape)
        if b is None or not shape:
            out[on] = None
        elif shape[0] == b:
            out[on] = 0
        else:
            ks = [k for k, s in enumerate(shape) if s == b]
            out[on] = ks[0] if len(ks) == 1 else None
    return out


def _infer(model, names, first, outputs, target, run) -> Tuple[Dict[str, Optional[int]], Optional[int], str, Dict[str, Optional[int]]]:
    shaped = [(n, x) for n, x in zip(names, first) if x.dim() > 0]
    if not shaped:
        return {n: None for n in names}, None, "the inputs are scalars", {on: None for on, _ in outputs}
    seq_first = _sequence_first(model)
    # B, the likeliest first: the target's first axis where every input
    # has an axis that size; the size every input shares at the first
    # input's axis 0 (axis 1 in a sequence-first model), or its only one;
    # the first input's axis 0
    common = set.intersection(*[set(x.shape) for _, x in shaped])
    x0 = shaped[0][1]
    pref = 1 if seq_first and x0.dim() >= 2 else 0
    sizes: List[int] = []
    if target is not None and getattr(target, "dim", lambda: 0)() > 0 and target.shape[0] in common:
        sizes.append(int(target.shape[0]))
    sizes += [int(x0.shape[k]) for k in (pref, 0) if x0.shape[k] in common]
    if len(common) == 1:
        sizes.append(int(next(iter(common))))
    sizes.append(int(x0.shape[0]))
    sizes = list(dict.fromkeys(sizes))

    def order(x, b) -> List[int]:
        # the axes of size b, the likeliest first: 1 in a sequence-first
        # model ((T, B, F) features, (T, B) ids, (layers, B, H) states), else 0
        ks = [k for k in range(x.dim()) if x.shape[k] == b]
        likeliest = 1 if seq_first and x.dim() >= 2 else 0
        return sorted(ks, key=lambda k: (k != likeliest, k))

    b = sizes[0]
    cands = {n: order(x, b) for n, x in zip(names, first)}
    plain = not seq_first and all(cands[n][:1] == [0] and len(cands[n]) == 1 for n, _ in shaped)
    if plain or b < 2 or run is None:
        assign = {n: (cands[n][0] if cands[n] else None) for n in names}
        why = "axis 0 of every input" if plain else "the size %d the inputs share" % b
        return assign, b, why, _by_size(outputs, b)
    # the likeliest assignments, each checked by running one sample
    for b in sizes:
        if b < 2:
            continue
        options = [c if c else [None] for c in (order(x, b) for x in first)]
        for combo in itertools.islice(itertools.product(*options), 8):
            assign = dict(zip(names, combo))
            if all(a is None for a in assign.values()):
                continue
            out_axes = _check(assign, first, names, outputs, b, run)
            if out_axes is not None:
                how = "inferred from the size %d %s and checked by running one sample%s" % (
                    b, "the inputs share" if len(shaped) > 1 else "of the batch",
                    " (sequence-first layers: %s)" % ", ".join(seq_first[:2]) if seq_first else "")
                return assign, b, how, out_axes
    return {n: None for n in names}, None, "no axis of size %s checked out as the batch's by running one sample: static shapes" % (
        " or ".join(map(str, sizes))), {on: None for on, _ in outputs}
