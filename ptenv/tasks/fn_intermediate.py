"""Function families of the intermediate tier: the intermediate result families' maths as functions
over any valid input, with the edge cases their result forms avoid."""

import torch

from ptenv.tasks.families import normal, randint, uniform
from ptenv.tasks.functions import Case, FunctionFamily


def _segments(g, n, s, empty: int = 0, dtype=torch.float32, d=None):
    d = randint(g, 1, 4) if d is None else d
    used = torch.randperm(s, generator=g)[: s - empty]
    seg = used[torch.randint(0, len(used), (n,), generator=g)] if n else torch.zeros(0, dtype=torch.int64)
    return {"x": normal(g, n, d, dtype=dtype), "seg": seg, "num_segments": s}


SEGMENT_MEAN = FunctionFamily(
    "tensor_ops/segment_mean_fn", "segment_mean", ("x", "seg", "num_segments"),
    "`x` is a float tensor of shape (N, D) (N >= 0, D >= 1; float32 or float64), `seg` an int64 tensor of "
    "shape (N,) with values in [0, num_segments), and `num_segments` a positive int. Return the tensor of "
    "shape (num_segments, D) and the dtype of `x` whose row `s` is the mean of the rows `x[n]` with "
    "`seg[n] == s`. A segment with no rows (an empty segment, which includes every segment when N is 0) "
    "gets a row of zeros, never NaN.",
    (
        Case("every segment used", "the mean of the rows", lambda g: _segments(g, randint(g, 6, 12), randint(g, 2, 4))),
        Case("empty segment", "A segment with no rows", lambda g: _segments(g, randint(g, 5, 10), randint(g, 3, 6), empty=randint(g, 1, 2))),
        Case("no rows at all", "when N is 0", lambda g: _segments(g, 0, randint(g, 1, 4))),
        Case("float64 input", "float32 or float64", lambda g: _segments(g, randint(g, 4, 9), randint(g, 2, 4), dtype=torch.float64)),
        Case("one column", "D >= 1", lambda g: _segments(g, randint(g, 4, 9), randint(g, 2, 5), empty=1, d=1)),
    ),
    "def segment_mean(x, seg, num_segments):\n"
    "    sums = torch.zeros(num_segments, x.shape[1], dtype=x.dtype).index_add_(0, seg, x)\n"
    "    counts = torch.zeros(num_segments, dtype=x.dtype).index_add_(0, seg, torch.ones(len(seg), dtype=x.dtype))\n"
    "    return sums / counts.clamp(min=1)[:, None]\n",
    wrong={
        "nan_for_empty":
            "def segment_mean(x, seg, num_segments):\n"
            "    sums = torch.zeros(num_segments, x.shape[1], dtype=x.dtype).index_add_(0, seg, x)\n"
            "    counts = torch.zeros(num_segments, dtype=x.dtype).index_add_(0, seg, torch.ones(len(seg), dtype=x.dtype))\n"
            "    return sums / counts[:, None]\n",
        "float32_always":
            "def segment_mean(x, seg, num_segments):\n"
            "    sums = torch.zeros(num_segments, x.shape[1]).index_add_(0, seg, x.float())\n"
            "    counts = torch.zeros(num_segments).index_add_(0, seg, torch.ones(len(seg)))\n"
            "    return sums / counts.clamp(min=1)[:, None]\n",
        "segments_seen_only":
            "def segment_mean(x, seg, num_segments):\n"
            "    return torch.stack([x[seg == s].mean(0) for s in seg.unique()])\n",
    },
    hint="`Tensor.index_add_` sums rows by index; count the rows the same way.",
)


def _masked(g, rows, cols, *, empty_row=False, large=False, dtype=torch.float32):
    mask = torch.rand(rows, cols, generator=g) < 0.6
    mask[torch.arange(rows), torch.randint(0, cols, (rows,), generator=g)] = True
    if empty_row:
        mask[randint(g, 0, rows - 1)] = False
    scale = uniform(g, 200.0, 800.0, rows, 1) if large else torch.zeros(rows, 1)
    return {"x": (scale + normal(g, rows, cols, scale=1.5)).to(dtype), "mask": mask}


MASKED_SOFTMAX = FunctionFamily(
    "nn_modules/masked_softmax_fn", "masked_softmax", ("x", "mask"),
    "`x` is a float tensor of shape (R, C) (R, C >= 1; float32 or float64) and `mask` a bool tensor of the "
    "same shape. Return a tensor like `x` whose row `i` is the softmax of `x[i]` over only the positions "
    "where `mask[i]` is True: `exp(x[i, j]) / sum over {k : mask[i, k]} of exp(x[i, k])` there, and exactly "
    "0 where `mask[i, j]` is False. A row whose mask is all False is all zeros (never NaN). Entries of `x` "
    "may be in the hundreds, so it must not overflow.",
    (
        Case("small values", "the softmax of `x[i]`", lambda g: _masked(g, randint(g, 2, 4), randint(g, 3, 7))),
        Case("values in the hundreds", "in the hundreds", lambda g: _masked(g, randint(g, 2, 4), randint(g, 3, 7), large=True)),
        Case("fully masked row", "mask is all False", lambda g: _masked(g, randint(g, 2, 4), randint(g, 3, 7), empty_row=True)),
        Case("float64 input", "float32 or float64", lambda g: _masked(g, randint(g, 2, 4), randint(g, 3, 7), dtype=torch.float64)),
        Case("one column", "C >= 1", lambda g: _masked(g, randint(g, 2, 5), 1, empty_row=True)),
    ),
    "def masked_softmax(x, mask):\n"
    "    top = torch.where(mask, x, torch.full_like(x, float('-inf'))).amax(dim=1, keepdim=True)\n"
    "    e = torch.where(mask, torch.exp(x - torch.where(torch.isinf(top), torch.zeros_like(top), top)), torch.zeros_like(x))\n"
    "    total = e.sum(dim=1, keepdim=True)\n"
    "    return torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(e))\n",
    wrong={
        "nan_rows":
            "def masked_softmax(x, mask):\n"
            "    return torch.softmax(x.masked_fill(~mask, float('-inf')), dim=1)\n",
        "overflows":
            "def masked_softmax(x, mask):\n"
            "    e = torch.exp(x) * mask\n"
            "    s = e.sum(1, keepdim=True)\n"
            "    return torch.where(s > 0, e / s, torch.zeros_like(e))\n",
    },
    hint="subtract each row's largest allowed value before `torch.exp`.",
)

FAMILIES = [SEGMENT_MEAN, MASKED_SOFTMAX]
