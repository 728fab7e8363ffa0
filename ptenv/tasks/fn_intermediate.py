"""Function families of the intermediate tier: the intermediate result families' maths as functions
over any valid input, with the edge cases their result forms avoid."""

import math

import torch

from ptenv.tasks.families import away_from_zero, normal, pick, randint, uniform
from ptenv.tasks.allowed import SCATTER, SOFTMAX, SORT
from ptenv.tasks.functions import Case, FunctionFamily


def _segment_ids(g, n: int, s: int, empty: int = 0) -> torch.Tensor:
    """n segment ids among s segments, `empty` of which get none."""
    used = torch.randperm(s, generator=g)[: s - empty]
    return used[torch.randint(0, len(used), (n,), generator=g)] if n else torch.zeros(0, dtype=torch.int64)


def _segments(g, n, s, empty: int = 0, dtype=torch.float32, d=None):
    d = randint(g, 1, 4) if d is None else d
    seg = _segment_ids(g, n, s, empty)
    return {"x": normal(g, n, d, dtype=dtype), "seg": seg, "num_segments": s}


_SEGMENT_MEAN_LITERAL = """
def segment_mean(x, seg, num_segments):
    out = torch.zeros(num_segments, x.shape[1], dtype=x.dtype)
    for s in range(num_segments):
        rows = x[seg == s]
        if len(rows):
            out[s] = rows.mean(0)
    return out
"""

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
    also_correct={"literal": _SEGMENT_MEAN_LITERAL.lstrip()},
    hint="`Tensor.index_add_` sums rows by index; count the rows the same way.",
    allowed=(SCATTER,),
)


def _masked(g, rows, cols, *, empty_row=False, large=False, dtype=torch.float32):
    mask = torch.rand(rows, cols, generator=g) < 0.6
    mask[torch.arange(rows), torch.randint(0, cols, (rows,), generator=g)] = True
    if empty_row:
        mask[randint(g, 0, rows - 1)] = False
    # Large values in float64, past where its exp overflows (709): in float32, x - logsumexp(x) near
    # 500 is rounded by 3e-5 relative, more than the tolerance, so a fair log-space answer would fail.
    scale = uniform(g, 750.0, 1000.0, rows, 1, dtype=torch.float64) if large else torch.zeros(rows, 1)
    return {"x": (scale + normal(g, rows, cols, scale=1.5)).to(torch.float64 if large else dtype), "mask": mask}


_MASKED_SOFTMAX_LITERAL = """
def masked_softmax(x, mask):
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        if not mask[i].any():
            continue
        m = x[i][mask[i]].max()
        e = torch.exp(torch.where(mask[i], x[i], m) - m)
        e = torch.where(mask[i], e, torch.zeros_like(e))
        out[i] = e / e.sum()
    return out
"""

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
    also_correct={
        "literal": _MASKED_SOFTMAX_LITERAL.lstrip(),
        "log_space":
            "def masked_softmax(x, mask):\n"
            "    m = x.masked_fill(~mask, float('-inf'))\n"
            "    return torch.exp(m - torch.logsumexp(m, dim=1, keepdim=True)).nan_to_num(0.0)\n",
    },
    hint="subtract each row's largest allowed value before `torch.exp`.",
)


# ---------------------------------------------------------------- the intermediate result families


def _pairwise(g, n=None, d=None, shared=False, dtype=torch.float32):
    n = randint(g, 3, 6) if n is None else n
    m, d = randint(g, 2, 5), randint(g, 2, 5) if d is None else d
    a, b = normal(g, n, d, dtype=dtype), normal(g, m, d, dtype=dtype)
    if shared:  # exact copies, and near copies (about 1e-3 away)
        for j in torch.randperm(m, generator=g)[: randint(g, 2, min(m, n, 3))].tolist():
            b[j] = a[randint(g, 0, n - 1)] + (normal(g, d, scale=1e-3, dtype=dtype) if randint(g, 0, 1) else 0.0)
    return {"a": a, "b": b}


_PAIRWISE_DISTANCE_LITERAL = """
def pairwise_distance(a, b):
    out = torch.empty(a.shape[0], b.shape[0], dtype=a.dtype)
    for j in range(b.shape[0]):
        out[:, j] = ((a - b[j]) ** 2).sum(1).sqrt()
    return out
"""

PAIRWISE_DISTANCE = FunctionFamily(
    "tensor_ops/pairwise_distance_fn", "pairwise_distance", ("a", "b"),
    "`a` is a float tensor of shape (N, D) and `b` one of shape (M, D), of one dtype (float32 or float64; N >= 0, "
    "M >= 1, D >= 1). Return the tensor of shape (N, M) and the dtype of `a` whose entry `[i, j]` is the Euclidean "
    "distance `sqrt(sum over k of (a[i, k] - b[j, k]) ** 2)` between row `i` of `a` and row `j` of `b` (the distance, "
    "not its square). Rows of `b` may be exact copies of rows of `a` (distance 0) or near copies (about 0.001 away): "
    "the result must be accurate to the dtype's rounding there too, so the expansion `|a|^2 + |b|^2 - 2 a.b`, "
    "whose rounding error survives the square root as about 1e-4, is not accurate enough. When N is 0 the result has shape (0, M).",
    (
        Case("typical", "the Euclidean distance", lambda g: _pairwise(g)),
        Case("copied rows", "exact copies of rows", lambda g: _pairwise(g, shared=True)),
        Case("empty a", "When N is 0", lambda g: _pairwise(g, n=0)),
        Case("one feature", "D >= 1", lambda g: _pairwise(g, d=1, shared=True)),
        Case("float64 input", "float32 or float64", lambda g: _pairwise(g, shared=True, dtype=torch.float64)),
    ),
    "def pairwise_distance(a, b):\n"
    "    return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1).sqrt()\n",
    wrong={
        "squared":
            "def pairwise_distance(a, b):\n"
            "    return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)\n",
        "expansion":
            "def pairwise_distance(a, b):\n"
            "    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T\n"
            "    return sq.clamp(min=0).sqrt()\n",
    },
    also_correct={"literal": _PAIRWISE_DISTANCE_LITERAL.lstrip()},
    hint="broadcast `a[:, None, :] - b[None, :, :]`, or `torch.cdist`.",
)


def _topk(g, *, ties=False, k=None, dtype=torch.float32):
    r, c = randint(g, 2, 4), randint(g, 5, 8)
    if dtype == torch.int64:
        x, fill = torch.randint(-4, 5, (r, c), generator=g), pick(g, [-1, 0, -9])
    elif ties:
        x, fill = (torch.randint(-3, 4, (r, c), generator=g) * 0.5).to(dtype), pick(g, [-1.0, 0.0, -5.0])
    else:
        x, fill = normal(g, r, c, dtype=dtype), pick(g, [-1.0, 0.0, -5.0])
    return {"x": x, "k": randint(g, 2, c - 2) if k is None else (c if k == "C" else k), "fill": fill}


_TOPK_KEEP_LITERAL = """
def topk_keep(x, k, fill):
    C = x.shape[1]
    column = torch.arange(C)
    a, b = x[:, :, None], x[:, None, :]  # a: element j, b: element l
    # l outranks j when it is larger, or equal and at a lower column
    ahead = (b > a) | ((b == a) & (column[None, :] < column[:, None]))
    keep = ahead.sum(-1) < k
    return torch.where(keep, x, torch.full_like(x, fill))
"""

TOPK_KEEP = FunctionFamily(
    "tensor_ops/topk_keep_fn", "topk_keep", ("x", "k", "fill"),
    "`x` is a tensor of shape (R, C) (R, C >= 1; float32, float64 or int64), `k` an int with 0 <= k <= C, and `fill` "
    "a Python number (an int when `x` is int64). Return the tensor of the shape and dtype of `x` that keeps, in each "
    "row, the k largest values of that row in their places and sets every other element to `fill`. Exactly k "
    "elements are kept per row: when equal values (ties) straddle the k-th place, the ones at lower column indices "
    "are kept. With k = 0 every element is `fill`; with k = C the row is unchanged.",
    (
        Case("distinct values", "the k largest values", lambda g: _topk(g)),
        Case("tied values", "equal values (ties)", lambda g: _topk(g, ties=True)),
        Case("k is 0", "With k = 0", lambda g: _topk(g, ties=True, k=0)),
        Case("k equals C", "with k = C", lambda g: _topk(g, ties=True, k="C")),
        Case("int64 input", "int64)", lambda g: _topk(g, dtype=torch.int64)),
        Case("float64 input", "float32, float64", lambda g: _topk(g, ties=True, dtype=torch.float64)),
    ),
    "def topk_keep(x, k, fill):\n"
    "    idx = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :k]\n"
    "    keep = torch.zeros(x.shape, dtype=torch.bool).scatter(1, idx, torch.ones(idx.shape, dtype=torch.bool))\n"
    "    return torch.where(keep, x, torch.full_like(x, fill))\n",
    wrong={
        "threshold_keeps_ties":
            "def topk_keep(x, k, fill):\n"
            "    kth = x.sort(dim=1, descending=True).values[:, k - 1:k]\n"
            "    return torch.where(x >= kth, x, torch.full_like(x, fill))\n",
        "ties_high_index":
            "def topk_keep(x, k, fill):\n"
            "    c = x.shape[1]\n"
            "    idx = c - 1 - torch.sort(x.flip(1), dim=1, descending=True, stable=True).indices[:, :k]\n"
            "    keep = torch.zeros(x.shape, dtype=torch.bool).scatter(1, idx, torch.ones(idx.shape, dtype=torch.bool))\n"
            "    return torch.where(keep, x, torch.full_like(x, fill))\n",
    },
    also_correct={"literal": _TOPK_KEEP_LITERAL.lstrip()},
    hint="`torch.sort(..., descending=True, stable=True)` gives the kept indices; `scatter` marks them.",
    allowed=(SORT, SCATTER),
)


def _divmod(g, *, negative=False, exact=False, large=False, dtype=torch.int64):
    n = randint(g, 6, 10)
    a = torch.randint(-50, 51, (n,), generator=g)
    b = torch.randint(1, 9, (n,), generator=g) * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    if negative:
        a, b = -a.abs() - 1, b.abs() * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    if exact:
        a = b * torch.randint(-9, 10, (n,), generator=g)
        a[randint(g, 0, n - 1)] = 0
    if large:
        a = torch.randint(2 ** 33, 2 ** 40, (n,), generator=g) * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
        b = torch.randint(3, 1000, (n,), generator=g) * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    shape = pick(g, [(n,), (1, n)]) if not large else (n,)
    return {"a": a.to(dtype).reshape(shape), "b": b.to(dtype).reshape(shape)}


_DIVISION_MODES_LITERAL = """
def division_modes(a, b):
    floor_q, floor_r, trunc_q, trunc_r = [], [], [], []
    for p, q in zip(a.flatten().tolist(), b.flatten().tolist()):
        f = p // q
        t = abs(p) // abs(q) * (1 if (p < 0) == (q < 0) else -1)
        floor_q.append(f)
        floor_r.append(p - q * f)
        trunc_q.append(t)
        trunc_r.append(p - q * t)
    return torch.tensor([floor_q, floor_r, trunc_q, trunc_r], dtype=a.dtype).reshape(4, *a.shape)
"""

DIVISION_MODES = FunctionFamily(
    "tensor_ops/division_modes_fn", "division_modes", ("a", "b"),
    "`a` and `b` are integer tensors of one shape S (rank 1 or 2) and one dtype (int32 or int64); no entry of `b` is "
    "0. Return the tensor of shape (4, *S) and the dtype of `a` stacking, element-wise: [0] the quotient `a / b` "
    "rounded toward negative infinity, [1] the remainder that goes with it, `a - b * [0]` (it has the sign of `b`, "
    "or is 0), [2] the quotient rounded toward zero, [3] its remainder `a - b * [2]` (it has the sign of `a`, or is "
    "0). Exact multiples give remainder 0 in both modes. Entries of `a` may be as large as 2 ** 40 in absolute value "
    "(int64), so the quotients must be exact integers, not rounded through float32.",
    (
        Case("typical", "the quotient `a / b`", lambda g: _divmod(g)),
        Case("negative operands", "the sign of `b`", lambda g: _divmod(g, negative=True)),
        Case("exact multiples", "Exact multiples", lambda g: _divmod(g, exact=True)),
        Case("int32 input", "int32 or int64", lambda g: _divmod(g, dtype=torch.int32)),
        Case("large values", "as large as 2 ** 40", lambda g: _divmod(g, large=True)),
    ),
    "def division_modes(a, b):\n"
    "    q_floor = torch.div(a, b, rounding_mode='floor')\n"
    "    q_trunc = torch.div(a, b, rounding_mode='trunc')\n"
    "    return torch.stack([q_floor, a - b * q_floor, q_trunc, a - b * q_trunc])\n",
    wrong={
        "truncation_for_both":
            "def division_modes(a, b):\n"
            "    q = torch.div(a, b, rounding_mode='trunc')\n"
            "    return torch.stack([q, a - b * q, q, a - b * q])\n",
        "float_division":
            "def division_modes(a, b):\n"
            "    q = a / b\n"
            "    qf, qt = torch.floor(q).to(a.dtype), torch.trunc(q).to(a.dtype)\n"
            "    return torch.stack([qf, a - b * qf, qt, a - b * qt])\n",
        "fmod_for_floor":
            "def division_modes(a, b):\n"
            "    q_floor = torch.div(a, b, rounding_mode='floor')\n"
            "    q_trunc = torch.div(a, b, rounding_mode='trunc')\n"
            "    return torch.stack([q_floor, torch.fmod(a, b), q_trunc, torch.fmod(a, b)])\n",
    },
    also_correct={"literal": _DIVISION_MODES_LITERAL.lstrip()},
    hint="`torch.div(a, b, rounding_mode=...)` with 'floor' and 'trunc'.",
)


def _lse(g, shape, dim, *, offset=None, dtype=torch.float32):
    x = normal(g, *shape, scale=2.0)
    if offset is not None:
        x = x * 10.0 + offset
    return {"x": x.to(dtype), "dim": dim}


_LOGSUMEXP_LITERAL = """
def logsumexp(x, dim):
    m = x.amax(dim, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)
"""

LOGSUMEXP = FunctionFamily(
    "nn_modules/logsumexp_extreme_fn", "logsumexp", ("x", "dim"),
    "`x` is a float tensor of rank 1, 2 or 3 (float32 or float64) and `dim` an int in [-rank, rank) (a negative dim "
    "counts from the end); the size of `x` along `dim` is >= 1. Return `log(sum over dim of exp(x))`, of the dtype of "
    "`x`, with dimension `dim` removed (not kept as size 1; a rank-1 `x` gives a 0-dim tensor). Along a size-1 "
    "dimension it is `x` itself. Entries may be in the hundreds, positive (where `exp` overflows) or negative (where "
    "`exp` underflows to 0 and a plain log gives -inf): compute it without overflow or underflow.",
    (
        Case("typical", "log(sum over dim of exp(x))", lambda g: _lse(g, (randint(g, 2, 4), randint(g, 3, 6)), randint(g, 0, 1))),
        Case("values in the hundreds", "positive (where `exp` overflows)",
             lambda g: _lse(g, (randint(g, 2, 4), randint(g, 3, 6)), randint(g, 0, 1), offset=uniform(g, 200.0, 800.0, 1).item())),
        Case("large negative values", "negative (where `exp` underflows",
             lambda g: _lse(g, (randint(g, 2, 4), randint(g, 3, 6)), randint(g, 0, 1), offset=-uniform(g, 200.0, 800.0, 1).item())),
        Case("negative dim", "a negative dim",
             lambda g: _lse(g, (randint(g, 2, 3), randint(g, 2, 4), randint(g, 2, 4)), pick(g, [-2, -3]), offset=400.0)),
        Case("size-1 dimension", "size-1", lambda g: _lse(g, (randint(g, 2, 4), 1), pick(g, [1, -1]))),
        Case("float64 input", "float32 or float64",
             lambda g: _lse(g, (randint(g, 4, 8),), pick(g, [0, -1]), offset=-uniform(g, 200.0, 800.0, 1).item(), dtype=torch.float64)),
    ),
    "def logsumexp(x, dim):\n"
    "    return torch.logsumexp(x, dim=dim)\n",
    wrong={
        "naive":
            "def logsumexp(x, dim):\n"
            "    return torch.log(torch.exp(x).sum(dim))\n",
        "keepdim":
            "def logsumexp(x, dim):\n"
            "    return torch.logsumexp(x, dim=dim, keepdim=True)\n",
        "max_only":
            "def logsumexp(x, dim):\n"
            "    return x.amax(dim)\n",
    },
    also_correct={"literal": _LOGSUMEXP_LITERAL.lstrip(),
                  "by_hand": 'def logsumexp(x, dim):\n    m = x.amax(dim, keepdim=True)\n    return (m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)\n'},
    hint="subtract the maximum along `dim` before `torch.exp`, or `torch.logsumexp`.",
)


def _attention(g, *, empty=False, full=False, t=None, dtype=torch.float32):
    b, t, d, e = randint(g, 1, 3), randint(g, 3, 6) if t is None else t, randint(g, 2, 4), randint(g, 2, 4)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    if full:
        lengths[:] = t
    elif t > 1:
        lengths[randint(g, 0, b - 1)] = randint(g, 1, t - 1)  # some padding
    if empty:
        lengths[randint(g, 0, b - 1)] = 0
    # Positive values: an output is a weighted average of them, never a sum cancelling near 0, where another
    # float32 order of the same sums would differ by a good part of the tolerance (issue 35).
    return {"q": normal(g, b, t, d, dtype=dtype), "k": normal(g, b, t, d, dtype=dtype),
            "v": uniform(g, 0.5, 1.5, b, t, e, dtype=dtype), "lengths": lengths}


_CAUSAL_ATTENTION_LITERAL = """
def attention(q, k, v, lengths):
    import math
    B, T, D = q.shape
    s = (q @ k.transpose(1, 2)) / math.sqrt(D)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= i)[None] & (j[None] < lengths[:, None, None])
    m = torch.where(allowed, s, torch.full_like(s, float('-inf'))).amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.where(allowed, torch.exp(torch.where(allowed, s, m) - m), torch.zeros_like(s))
    total = e.sum(-1, keepdim=True)
    weight = torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(e))
    return weight @ v
"""

CAUSAL_ATTENTION = FunctionFamily(
    "nn_modules/causal_padded_attention_fn", "attention", ("q", "k", "v", "lengths"),
    "`q` and `k` are float tensors of shape (B, T, D), `v` of shape (B, T, E), all of one dtype (float32 or float64; "
    "B, T, D, E >= 1), and `lengths` an int64 tensor of shape (B,) with entries in [0, T]. Scaled dot-product "
    "attention per batch element `b`: scores `s[b, i, j] = (q[b, i] . k[b, j]) / sqrt(D)`; query `i` may attend to "
    "key `j` only when `j <= i` (causal) and `j < lengths[b]` (keys at or past the length are padding; queries past "
    "the length are still computed, over the keys they may attend to). The weights are the softmax of the allowed "
    "scores over `j` (disallowed keys get weight 0), and `result[b, i] = sum over j of weight[b, i, j] * v[b, j]`. "
    "When `lengths[b]` is 0 (an empty sequence) no key is allowed and every `result[b, i]` is a row of zeros, "
    "never NaN. Return the tensor of shape (B, T, E) and the dtype of `q`.",
    (
        Case("typical", "Scaled dot-product attention", lambda g: _attention(g)),
        Case("empty sequence", "an empty sequence", lambda g: _attention(g, empty=True)),
        Case("no padding", "keys at or past the length are padding", lambda g: _attention(g, full=True)),
        Case("one position", "B, T, D, E >= 1", lambda g: _attention(g, t=1, empty=randint(g, 0, 1) == 1)),
        Case("float64 input", "float32 or float64", lambda g: _attention(g, empty=True, dtype=torch.float64)),
    ),
    "def attention(q, k, v, lengths):\n"
    "    t = q.shape[1]\n"
    "    allowed = torch.ones(t, t, dtype=torch.bool).tril() & (torch.arange(t) < lengths[:, None, None])\n"
    "    scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5\n"
    "    weights = torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1)\n"
    "    return torch.nan_to_num(weights, nan=0.0) @ v\n",
    wrong={
        "padding_ignored":
            "def attention(q, k, v, lengths):\n"
            "    t = q.shape[1]\n"
            "    allowed = torch.ones(t, t, dtype=torch.bool).tril()\n"
            "    scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5\n"
            "    return torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1) @ v\n",
        "nan_rows":
            "def attention(q, k, v, lengths):\n"
            "    t = q.shape[1]\n"
            "    allowed = torch.ones(t, t, dtype=torch.bool).tril() & (torch.arange(t) < lengths[:, None, None])\n"
            "    scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5\n"
            "    return torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1) @ v\n",
        "padded_queries_zeroed":
            "def attention(q, k, v, lengths):\n"
            "    t = q.shape[1]\n"
            "    allowed = torch.ones(t, t, dtype=torch.bool).tril() & (torch.arange(t) < lengths[:, None, None])\n"
            "    scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5\n"
            "    w = torch.nan_to_num(torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1), nan=0.0)\n"
            "    return (w @ v) * (torch.arange(t) < lengths[:, None])[:, :, None]\n",
    },
    also_correct={"literal": _CAUSAL_ATTENTION_LITERAL.lstrip()},
    hint="mask the scores with `-inf` before `torch.softmax`, and replace the rows with no allowed key.",
    allowed=(SOFTMAX,),
)


def _apart(g, count: int, scale: float) -> torch.Tensor:
    """`count` (>= 2) float64 values summing to 0, each at least scale / 8 from 0 and none an outlier: pairs
    a, -a (for an odd count, one a, b, -(a + b) with a and b of one sign). A normalised value near 0 comes from
    an x near its mean, where float32's rounding of the mean (which the summation order decides) moves it by
    about half the absolute tolerance; and two or three values close together leave their normalised values to
    eps, and to that rounding (issue 35)."""
    size = scale / 8 + normal(g, count, scale=scale, dtype=torch.float64).abs()
    sign = torch.where(torch.rand(count // 2, generator=g) < 0.5, -1.0, 1.0).double()
    a = sign * size[: count // 2]
    values = torch.cat([a, -a])
    if count % 2:
        b = sign[0] * size[-1]
        values = torch.cat([values, b[None]])
        values[count // 2] = -(a[0] + b)
    return values[torch.randperm(count, generator=g)]


def _batchnorm(g, *, rank=3, n=None, length=None, affine=True, dtype=torch.float32):
    n, c = randint(g, 2, 5) if n is None else n, randint(g, 1, 4)
    length = randint(g, 2, 5) if length is None else length
    shape = (n, c, length) if rank == 3 else (n, c)
    # Each channel about a mean of 0.5, no value near it (_apart).
    per_channel = torch.stack([0.5 + _apart(g, n * (length if rank == 3 else 1), 2.0) for _ in range(c)])
    x = per_channel.reshape(c, n, -1).transpose(0, 1).reshape(shape)
    return {"x": x.to(dtype),
            "weight": uniform(g, 0.5, 1.0, c, dtype=dtype) if affine else None,
            "bias": away_from_zero(g, c, dtype) if affine else None,
            "running_mean": normal(g, c, scale=0.3, dtype=dtype), "running_var": uniform(g, 0.5, 2.0, c, dtype=dtype),
            "momentum": pick(g, [0.1, 0.2, 0.05]), "eps": pick(g, [1e-5, 1e-3])}


_BATCH_NORM_LITERAL = """
def batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):
    dims = (0, 2) if x.dim() == 3 else (0,)
    shape = (1, -1, 1) if x.dim() == 3 else (1, -1)
    count = x.numel() // x.shape[1]
    mean = x.sum(dims) / count
    squares = ((x - mean.reshape(shape)) ** 2).sum(dims)
    var = squares / count
    y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        y = y * weight.reshape(shape) + bias.reshape(shape)
    unbiased_var = squares / (count - 1)
    return (y, (1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * unbiased_var)
"""

BATCH_NORM = FunctionFamily(
    "nn_modules/batch_norm_training_fn", "batch_norm_train",
    ("x", "weight", "bias", "running_mean", "running_var", "momentum", "eps"),
    "`x` is a float tensor of shape (N, C, L) or (N, C) (float32 or float64), with at least two values per channel "
    "(N * L >= 2, where L is 1 for a rank-2 `x`); `weight` and `bias` are tensors of shape (C,) or both None (no "
    "affine: weight 1, bias 0); `running_mean` and `running_var` are tensors of shape (C,); all of the dtype of `x`. "
    "`momentum` in (0, 1) and `eps` > 0 are Python floats. One training-mode batch-norm step, per channel `c`: with "
    "`mean` and the biased variance `var` (divided by the count N * L) of `x[:, c]` over the N and L dimensions, "
    "`y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c]`; the new running statistics are `(1 - momentum) * "
    "running_mean + momentum * mean` and `(1 - momentum) * running_var + momentum * unbiased_var`, where "
    "`unbiased_var` divides by N * L - 1. A single sample (N = 1) is fine when L >= 2. Return the tuple `(y, "
    "new_running_mean, new_running_var)`: `y` of the shape of `x`, the others of shape (C,), all of the dtype of "
    "`x`; the input tensors are left unchanged.",
    (
        Case("typical", "One training-mode batch-norm step", lambda g: _batchnorm(g)),
        Case("rank 2 input", "or (N, C)", lambda g: _batchnorm(g, rank=2)),
        Case("no affine", "both None", lambda g: _batchnorm(g, affine=False)),
        Case("one sample", "A single sample (N = 1)", lambda g: _batchnorm(g, n=1)),
        Case("float64 input", "float32 or float64", lambda g: _batchnorm(g, dtype=torch.float64)),
    ),
    "def batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):\n"
    "    rm, rv = running_mean.clone(), running_var.clone()\n"
    "    y = torch.nn.functional.batch_norm(x, rm, rv, weight, bias, training=True, momentum=momentum, eps=eps)\n"
    "    return y, rm, rv\n",
    wrong={
        "biased_running_var":
            "def batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):\n"
            "    dims = [0, 2] if x.dim() == 3 else [0]\n"
            "    mean, var = x.mean(dims), x.var(dims, correction=0)\n"
            "    shape = (1, -1, 1) if x.dim() == 3 else (1, -1)\n"
            "    y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)\n"
            "    if weight is not None:\n"
            "        y = y * weight.reshape(shape) + bias.reshape(shape)\n"
            "    return y, (1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * var\n",
        "momentum_complement":
            "def batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):\n"
            "    rm, rv = running_mean.clone(), running_var.clone()\n"
            "    y = torch.nn.functional.batch_norm(x, rm, rv, weight, bias, training=True, momentum=1 - momentum, eps=eps)\n"
            "    return y, rm, rv\n",
        "unbiased_normalisation":
            "def batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):\n"
            "    dims = [0, 2] if x.dim() == 3 else [0]\n"
            "    mean, var = x.mean(dims), x.var(dims)\n"
            "    shape = (1, -1, 1) if x.dim() == 3 else (1, -1)\n"
            "    y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)\n"
            "    if weight is not None:\n"
            "        y = y * weight.reshape(shape) + bias.reshape(shape)\n"
            "    return y, (1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * var\n",
    },
    also_correct={"literal": _BATCH_NORM_LITERAL.lstrip(),
                  "by_hand": 'def batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):\n    dims, shape = ([0, 2], (1, -1, 1)) if x.dim() == 3 else ([0], (1, -1))\n    count = x.numel() // x.shape[1]\n    mean = x.mean(dims)\n    d = x - mean.reshape(shape)\n    var = (d * d).mean(dims)\n    y = d / torch.sqrt(var.reshape(shape) + eps)\n    if weight is not None:\n        y = y * weight.reshape(shape) + bias.reshape(shape)\n    unbiased = var * count / (count - 1)\n    return y, (1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * unbiased\n'},
    hint="`torch.nn.functional.batch_norm(..., training=True)` updates copies of the running statistics in place.",
)


def _groupnorm(g, *, groups=None, spatial=None, affine=True, dtype=torch.float32):
    groups = randint(g, 2, 3) if groups is None else groups
    per = randint(g, 2, 3) if groups != "C" else 1
    groups = randint(g, 2, 4) if groups == "C" else groups
    c = groups * per
    spatial = (randint(g, 2, 4), randint(g, 2, 4)) if spatial is None else spatial
    n = randint(g, 1, 3)
    # Each (sample, group) about its own mean, no value near it (_apart).
    x = torch.stack([normal(g, 1, scale=0.3, dtype=torch.float64) + _apart(g, per * math.prod(spatial), 1.5)
                     for _ in range(n * groups)]).reshape(n, c, *spatial)
    return {"x": x.to(dtype), "weight": uniform(g, 0.5, 1.0, c, dtype=dtype) if affine else None,
            "bias": away_from_zero(g, c, dtype) if affine else None, "groups": groups, "eps": pick(g, [1e-5, 1e-3])}


_GROUP_NORM_LITERAL = """
def group_norm(x, weight, bias, groups, eps):
    N, C = x.shape[:2]
    per = C // groups
    out = torch.empty_like(x)
    for g in range(groups):
        part = x[:, g * per:(g + 1) * per]
        values = part.reshape(N, -1)
        mean = values.mean(1)
        var = ((values - mean[:, None]) ** 2).mean(1)
        shape = (N,) + (1,) * (x.dim() - 1)
        out[:, g * per:(g + 1) * per] = (part - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        shape = (1, C) + (1,) * (x.dim() - 2)
        out = out * weight.reshape(shape) + bias.reshape(shape)
    return out
"""

GROUP_NORM = FunctionFamily(
    "nn_modules/group_norm_fn", "group_norm", ("x", "weight", "bias", "groups", "eps"),
    "`x` is a float tensor of shape (N, C, *) with any number of trailing (spatial) dimensions, including none "
    "(float32 or float64; N, C >= 1); `groups` a positive int dividing C; `weight` and `bias` tensors of shape (C,) "
    "of the dtype of `x`, or both None (no affine: weight 1, bias 0); `eps` > 0 a Python float. Group normalisation: "
    "the channels are split into `groups` consecutive equal groups (channels 0 to C/groups - 1 form group 0, and so "
    "on); each (sample, group) is normalised over its channels and all trailing positions with its own mean and "
    "biased variance (divided by the count), `(x - mean) / sqrt(var + eps)`, then channel `c` is scaled by "
    "`weight[c]` and shifted by `bias[c]`. One group normalises each sample as a whole; a group per channel (groups = "
    "C) normalises each channel alone, and a group of a single value gives `bias[c]` (0 without affine). Return the "
    "tensor of the shape and dtype of `x`.",
    (
        Case("typical", "Group normalisation", lambda g: _groupnorm(g)),
        Case("one group", "One group normalises", lambda g: _groupnorm(g, groups=1)),
        Case("a group per channel", "a group per channel", lambda g: _groupnorm(g, groups="C", spatial=(randint(g, 2, 5),))),
        Case("no spatial dims", "including none", lambda g: _groupnorm(g, spatial=())),
        Case("no affine", "both None", lambda g: _groupnorm(g, affine=False, spatial=(randint(g, 3, 6),))),
        Case("float64 input", "float32 or float64", lambda g: _groupnorm(g, dtype=torch.float64)),
    ),
    "def group_norm(x, weight, bias, groups, eps):\n"
    "    return torch.nn.functional.group_norm(x, groups, weight, bias, eps=eps)\n",
    wrong={
        "interleaved_groups":
            "def group_norm(x, weight, bias, groups, eps):\n"
            "    n, c = x.shape[:2]\n"
            "    t = x.reshape(n, c // groups, groups, -1).transpose(1, 2).reshape(n, groups, -1)\n"
            "    t = (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, correction=0, keepdim=True) + eps)\n"
            "    y = t.reshape(n, groups, c // groups, -1).transpose(1, 2).reshape(x.shape)\n"
            "    shape = (1, c) + (1,) * (x.dim() - 2)\n"
            "    return y if weight is None else y * weight.reshape(shape) + bias.reshape(shape)\n",
        "unbiased_variance":
            "def group_norm(x, weight, bias, groups, eps):\n"
            "    n, c = x.shape[:2]\n"
            "    t = x.reshape(n, groups, -1)\n"
            "    t = (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, keepdim=True).nan_to_num(0.0) + eps)\n"
            "    shape = (1, c) + (1,) * (x.dim() - 2)\n"
            "    y = t.reshape(x.shape)\n"
            "    return y if weight is None else y * weight.reshape(shape) + bias.reshape(shape)\n",
        "per_channel":
            "def group_norm(x, weight, bias, groups, eps):\n"
            "    return torch.nn.functional.group_norm(x, x.shape[1], weight, bias, eps=eps)\n",
    },
    also_correct={"literal": _GROUP_NORM_LITERAL.lstrip(),
                  "by_hand": 'def group_norm(x, weight, bias, groups, eps):\n    n, c = x.shape[:2]\n    t = x.reshape(n, groups, -1)\n    d = t - t.mean(-1, keepdim=True)\n    y = (d / torch.sqrt((d * d).mean(-1, keepdim=True) + eps)).reshape(x.shape)\n    shape = (1, c) + (1,) * (x.dim() - 2)\n    return y if weight is None else y * weight.reshape(shape) + bias.reshape(shape)\n'},
    hint="reshape to (N, groups, -1) for the statistics, or `torch.nn.functional.group_norm`.",
)


def _ste(g, *, halves=False, negative=False, shape=None, dtype=torch.float32):
    shape = (randint(g, 5, 9),) if shape is None else shape
    scale = pick(g, [2, 4, 8])
    x = normal(g, *shape, dtype=torch.float64)
    if halves:
        x = (torch.randint(-6, 6, shape, generator=g) + 0.5) / scale
        if negative:
            x = -x.abs()
    return {"x": x.to(dtype), "w": normal(g, *shape, dtype=dtype), "scale": scale}


_STRAIGHT_THROUGH_LITERAL = """
def ste_grad(x, w, scale):
    t = x * scale
    r = torch.floor(t + 0.5)
    halfway = (r - t) == 0.5
    r = torch.where(halfway & (torch.remainder(r, 2) == 1), r - 1, r)  # a half goes to the even one
    with torch.enable_grad():
        xg = x.detach().requires_grad_()
        q = xg + (r / scale - xg).detach()  # straight through: the identity in the backward pass
        (w * q ** 2).sum().backward()
    return xg.grad
"""

STRAIGHT_THROUGH = FunctionFamily(
    "autograd/straight_through_round_fn", "ste_grad", ("x", "w", "scale"),
    "`x` and `w` are float tensors of one shape (any rank >= 1) and dtype (float32 or float64), and `scale` a positive "
    "int. Quantise `x` with `q = round(x * scale) / scale`, where round goes to the nearest integer and a value "
    "exactly halfway between two integers rounds to the even one (round half to even: 2.5 -> 2, -0.5 -> -0 and "
    "-1.5 -> -2), using a straight-through estimator: the backward pass treats the quantiser as the identity (the "
    "incoming gradient passes through unchanged). Return the gradient with respect to `x` of `loss = sum(w * q ** "
    "2)`, which is `2 * w * q`, as a tensor of the shape and dtype of `x`. Autograd may be used.",
    (
        Case("typical", "straight-through estimator", lambda g: _ste(g)),
        Case("halfway values", "round half to even", lambda g: _ste(g, halves=True)),
        Case("negative halfway values", "-1.5 -> -2", lambda g: _ste(g, halves=True, negative=True)),
        Case("rank 2", "any rank >= 1", lambda g: _ste(g, halves=True, shape=(randint(g, 2, 3), randint(g, 2, 4)))),
        Case("float64 input", "float32 or float64", lambda g: _ste(g, halves=True, dtype=torch.float64)),
    ),
    "def ste_grad(x, w, scale):\n"
    "    return 2 * w * (torch.round(x * scale) / scale)\n",
    wrong={
        "half_up":
            "def ste_grad(x, w, scale):\n"
            "    return 2 * w * (torch.floor(x * scale + 0.5) / scale)\n",
        "half_away_from_zero":
            "def ste_grad(x, w, scale):\n"
            "    t = x * scale\n"
            "    return 2 * w * (torch.sign(t) * torch.floor(t.abs() + 0.5) / scale)\n",
        "unquantised":
            "def ste_grad(x, w, scale):\n"
            "    return 2 * w * x\n",
    },
    also_correct={"literal": _STRAIGHT_THROUGH_LITERAL.lstrip()},
    hint="`torch.round` rounds half to even; a custom `torch.autograd.Function` or `x + (q - x).detach()` "
         "gives the straight-through gradient.",
)


def _smoothing(g, *, ignored=True, all_ignored=False, eps=None, dtype=torch.float32):
    n, c = randint(g, 4, 7), randint(g, 2, 6)
    target = torch.randint(0, c, (n,), generator=g)
    if all_ignored:
        target[:] = -100
    elif ignored:
        target[torch.randperm(n, generator=g)[: randint(g, 1, n // 2)]] = -100
    return {"logits": normal(g, n, c, scale=2.0, dtype=dtype), "target": target,
            "eps": pick(g, [0.1, 0.2, 0.05]) if eps is None else eps}


_LABEL_SMOOTHING_LITERAL = """
def smoothed_cross_entropy(logits, target, eps):
    N, C = logits.shape
    keep = target != -100
    if not keep.any():
        return torch.zeros((), dtype=logits.dtype)
    losses = []
    for n in range(N):
        if not keep[n]:
            continue
        log_p = torch.log_softmax(logits[n], 0)
        dist = torch.full((C,), eps / C, dtype=logits.dtype)
        dist[target[n]] += 1 - eps
        losses.append(-(dist * log_p).sum())
    return torch.stack(losses).mean()
"""

LABEL_SMOOTHING = FunctionFamily(
    "losses/label_smoothing_ce_fn", "smoothed_cross_entropy", ("logits", "target", "eps"),
    "`logits` is a float tensor of shape (N, C) (N >= 1, C >= 2; float32 or float64), `target` an int64 tensor of "
    "shape (N,) whose entries are classes in [0, C) or -100 (ignored), and `eps` a Python float in [0, 1). "
    "Cross-entropy with label smoothing `eps`: for a sample with target `t`, the target distribution is `1 - eps` on "
    "class `t` plus `eps / C` on every class (including `t`; so `eps / C`, not `eps / (C - 1)`), and its loss is "
    "`-sum over c of dist[c] * log_softmax(logits[n])[c]`. Samples whose target is -100 are ignored: the result is "
    "the mean loss over the other samples, as a 0-dim tensor of the dtype of `logits`. When every sample is "
    "ignored the result is 0 (not NaN). With eps 0 it is the plain cross-entropy.",
    (
        Case("typical", "Cross-entropy with label smoothing", lambda g: _smoothing(g)),
        Case("every sample ignored", "When every sample is ignored", lambda g: _smoothing(g, all_ignored=True)),
        Case("no smoothing", "With eps 0", lambda g: _smoothing(g, eps=0.0)),
        Case("no ignored samples", "are ignored", lambda g: _smoothing(g, ignored=False)),
        Case("float64 input", "float32 or float64", lambda g: _smoothing(g, dtype=torch.float64)),
    ),
    "def smoothed_cross_entropy(logits, target, eps):\n"
    "    keep = target != -100\n"
    "    if not keep.any():\n"
    "        return torch.zeros((), dtype=logits.dtype)\n"
    "    return torch.nn.functional.cross_entropy(logits[keep], target[keep], label_smoothing=eps)\n",
    wrong={
        "nan_when_all_ignored":
            "def smoothed_cross_entropy(logits, target, eps):\n"
            "    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, label_smoothing=eps)\n",
        "smoothing_over_other_classes":
            "def smoothed_cross_entropy(logits, target, eps):\n"
            "    keep = target != -100\n"
            "    if not keep.any():\n"
            "        return torch.zeros((), dtype=logits.dtype)\n"
            "    logp = torch.log_softmax(logits[keep], dim=1)\n"
            "    dist = torch.full_like(logp, eps / (logits.shape[1] - 1))\n"
            "    dist[torch.arange(len(logp)), target[keep]] = 1 - eps\n"
            "    return -(dist * logp).sum(1).mean()\n",
        "mean_over_all_samples":
            "def smoothed_cross_entropy(logits, target, eps):\n"
            "    loss = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, label_smoothing=eps,\n"
            "                                             reduction='sum')\n"
            "    return loss / len(target)\n",
    },
    also_correct={"literal": _LABEL_SMOOTHING_LITERAL.lstrip(),
                  "by_hand": 'def smoothed_cross_entropy(logits, target, eps):\n    keep = target != -100\n    if not bool(keep.any()):\n        return torch.zeros((), dtype=logits.dtype)\n    shifted = logits[keep] - logits[keep].amax(1, keepdim=True)\n    logp = shifted - torch.log(torch.exp(shifted).sum(1, keepdim=True))\n    nll = -logp.gather(1, target[keep][:, None]).squeeze(1)\n    return ((1 - eps) * nll - eps * logp.mean(1)).mean()\n'},
    hint="`torch.nn.functional.cross_entropy(..., label_smoothing=eps)` on the kept samples.",
)


def _accumulation(g, *, uneven=False, unclipped=False, one=False, dtype=torch.float32):
    m, k, d, o = randint(g, 2, 3), randint(g, 2, 4), randint(g, 2, 4), randint(g, 1, 2)
    n = k * m - (randint(g, 1, m - 1) if uneven else 0)
    return {"w": normal(g, o, d, scale=0.5, dtype=dtype), "x": normal(g, n, d, dtype=dtype),
            "y": normal(g, n, o, dtype=dtype), "micro_batch": n + randint(g, 0, 2) if one else m,
            "lr": pick(g, [0.1, 0.05, 0.2]), "max_norm": pick(g, [50.0, 100.0]) if unclipped else pick(g, [0.1, 0.05])}


_GRAD_ACCUMULATION_LITERAL = """
def accumulate_clip_step(w, x, y, micro_batch, lr, max_norm):
    N = x.shape[0]
    starts = list(range(0, N, micro_batch))
    K = len(starts)
    G = torch.zeros_like(w)
    for s in starts:
        xb, yb = x[s:s + micro_batch], y[s:s + micro_batch]
        with torch.enable_grad():
            wg = w.detach().requires_grad_()
            loss = ((xb @ wg.T - yb) ** 2).mean() / K
            g, = torch.autograd.grad(loss, wg)
        G = G + g
    norm = torch.sqrt((G ** 2).sum())
    factor = max_norm / (norm + 1e-6)
    if factor < 1:
        G = G * factor
    return w - lr * G
"""

GRAD_ACCUMULATION = FunctionFamily(
    "optim/grad_accumulation_clip_fn", "accumulate_clip_step", ("w", "x", "y", "micro_batch", "lr", "max_norm"),
    "`w` is a float tensor of shape (O, D), `x` of shape (N, D) and `y` of shape (N, O) (N >= 1), all of one dtype "
    "(float32 or float64); `micro_batch` is a positive int, `lr` > 0 and `max_norm` > 0 Python floats. One "
    "optimiser step with gradient accumulation: split the rows of `x` and `y` into consecutive micro-batches of "
    "`micro_batch` rows (the last one has fewer rows when N is not a multiple of `micro_batch`; a single "
    "micro-batch when micro_batch >= N); with K the number of micro-batches, each micro-batch's loss is `mean((xb @ "
    "w.T - yb) ** 2) / K` (the mean over all its elements) and its gradient with respect to `w` is added to the "
    "accumulated gradient `G`. Then clip: with `norm` the L2 norm of all of `G`, multiply `G` by `max_norm / (norm + "
    "1e-6)` when that factor is below 1 (a gradient whose norm is below max_norm is left unchanged). Return `w - lr * "
    "G`, of the shape and dtype of `w` (the input is left unchanged).",
    (
        Case("typical", "gradient accumulation", lambda g: _accumulation(g)),
        Case("uneven last micro-batch", "the last one has fewer rows", lambda g: _accumulation(g, uneven=True)),
        Case("norm below max_norm", "left unchanged", lambda g: _accumulation(g, unclipped=True)),
        Case("one micro-batch", "a single micro-batch", lambda g: _accumulation(g, one=True)),
        Case("float64 input", "float32 or float64", lambda g: _accumulation(g, uneven=True, dtype=torch.float64)),
    ),
    "def accumulate_clip_step(w, x, y, micro_batch, lr, max_norm):\n"
    "    w = torch.nn.Parameter(w.clone())\n"
    "    xs, ys = x.split(micro_batch), y.split(micro_batch)\n"
    "    for xb, yb in zip(xs, ys):\n"
    "        (((xb @ w.T - yb) ** 2).mean() / len(xs)).backward()\n"
    "    torch.nn.utils.clip_grad_norm_([w], max_norm=max_norm)\n"
    "    with torch.no_grad():\n"
    "        w -= lr * w.grad\n"
    "    return w.detach().clone()\n",
    wrong={
        "full_batch_gradient":
            "def accumulate_clip_step(w, x, y, micro_batch, lr, max_norm):\n"
            "    grad = 2 * (x @ w.T - y).T @ x / y.numel()\n"
            "    factor = min(1.0, max_norm / (grad.norm().item() + 1e-6))\n"
            "    return w - lr * grad * factor\n",
        "always_rescaled":
            "def accumulate_clip_step(w, x, y, micro_batch, lr, max_norm):\n"
            "    xs, ys = x.split(micro_batch), y.split(micro_batch)\n"
            "    grad = sum(2 * (xb @ w.T - yb).T @ xb / yb.numel() / len(xs) for xb, yb in zip(xs, ys))\n"
            "    return w - lr * grad * max_norm / (grad.norm() + 1e-6)\n",
        "not_divided_by_k":
            "def accumulate_clip_step(w, x, y, micro_batch, lr, max_norm):\n"
            "    xs, ys = x.split(micro_batch), y.split(micro_batch)\n"
            "    grad = sum(2 * (xb @ w.T - yb).T @ xb / yb.numel() for xb, yb in zip(xs, ys))\n"
            "    factor = min(1.0, max_norm / (grad.norm().item() + 1e-6))\n"
            "    return w - lr * grad * factor\n",
    },
    also_correct={"literal": _GRAD_ACCUMULATION_LITERAL.lstrip()},
    hint="`Tensor.split` for the micro-batches, `backward()` accumulates, then `torch.nn.utils.clip_grad_norm_`.",
)


# ---------------------------------------------------------------- issue 38: contracts no library computes whole


def _trimmed(g, *, k=None, n=None, middle=False, ties=False, dtype=torch.float32):
    k = randint(g, 1, 3) if k is None else k
    if n is None:
        n = 2 * k + 1 if middle else randint(g, 2 * k + 2, 2 * k + 7)
    c = randint(g, 1, 4)
    # Each column about an offset of 3 to 4 (either sign), so no mean cancels near 0, where another float32
    # order of the same sum would differ by a good part of the tolerance (issue 35).
    offset = away_from_zero(g, c, torch.float64)
    if ties:  # a few levels half a unit apart in each column: equal values straddle the cuts
        noise = torch.randint(-2, 3, (n, c), generator=g).double() / 2
    else:
        noise = normal(g, n, c, dtype=torch.float64)
    return {"x": (offset + noise).to(dtype), "k": k}


_TRIMMED_MEAN_LITERAL = """
def trimmed_mean(x, k):
    N, C = x.shape
    out = torch.empty(C, dtype=x.dtype)
    for c in range(C):
        column = sorted(x[:, c].tolist())
        kept = column[k:N - k]  # drop the k smallest and the k largest
        out[c] = sum(kept) / len(kept)
    return out
"""

# The efficiency level's budget (issue 38): the cheapest graph known, from a search of our own with the
# meter, 0.86 times the cost of `by_hand`, which set it before (40 hidden sets).
_TRIMMED_MEAN_EFFICIENT = """
import torch

def trimmed_mean(x, k):
    N, C = x.shape
    if N == 1:
        return x[0]
    if k == 0:
        return x.mean(0)
    if N == 2 * k + 1:
        return x.sort(dim=0).values[k]
    NC = N * C
    # sort path: sort 8+3NC, slice 8+NC, mean 8+(N-2k)C+C ; k=1 path: mean/amax/amin 3*(8+NC+C), 2 lerps 2*(8+3C)
    if k == 1 and 40 + 3 * NC + 9 * C < 24 + 4 * NC + (N - 1) * C:
        u = torch.lerp(x.mean(0), x.amax(0), -1.0 / (N - 1))
        return torch.lerp(u, x.amin(0), -1.0 / (N - 2))
    return x.sort(dim=0).values[k:N - k].mean(0)
"""

TRIMMED_MEAN = FunctionFamily(
    "tensor_ops/trimmed_mean_fn", "trimmed_mean", ("x", "k"),
    "`x` is a float tensor of shape (N, C) (float32 or float64; C >= 1) and `k` an int with k >= 0 and N >= 2k + 1. "
    "Return the tensor of shape (C,) and the dtype of `x` whose entry `c` is the trimmed mean of column `x[:, c]`: "
    "sort the column, drop its k smallest and its k largest entries, and return the mean of the N - 2k entries "
    "left. Exactly k entries are dropped at each end even when equal values (ties) straddle a cut: which of the "
    "equal copies are dropped does not change the value, and the copies not dropped stay in the mean. With k = 0 "
    "it is the plain mean of the column; with N = 2k + 1 it is the column's middle value (its median).",
    (
        Case("typical", "the trimmed mean of column", lambda g: _trimmed(g)),
        Case("tied values", "equal values (ties)", lambda g: _trimmed(g, ties=True)),
        Case("k is 0", "With k = 0", lambda g: _trimmed(g, k=0, n=randint(g, 1, 8))),
        Case("one value left", "with N = 2k + 1", lambda g: _trimmed(g, k=randint(g, 1, 4), middle=True)),
        Case("float64 input", "float32 or float64", lambda g: _trimmed(g, ties=randint(g, 0, 1) == 1, dtype=torch.float64)),
    ),
    "def trimmed_mean(x, k):\n"
    "    n = x.shape[0]\n"
    "    return x.sort(dim=0).values[k:n - k].mean(dim=0)\n",
    wrong={
        "slice_to_minus_k":
            "def trimmed_mean(x, k):\n"
            "    return x.sort(dim=0).values[k:-k].mean(dim=0)\n",
        "keeps_tied_copies":
            "def trimmed_mean(x, k):\n"
            "    s = x.sort(dim=0).values\n"
            "    keep = (x >= s[k]) & (x <= s[x.shape[0] - 1 - k])\n"
            "    return (x * keep).sum(0) / keep.sum(0)\n",
        "drops_tied_copies":
            "def trimmed_mean(x, k):\n"
            "    if k == 0:\n"
            "        return x.mean(0)\n"
            "    s = x.sort(dim=0).values\n"
            "    keep = (x > s[k - 1]) & (x < s[x.shape[0] - k])\n"
            "    return (x * keep).sum(0) / keep.sum(0)\n",
        "divides_by_n":
            "def trimmed_mean(x, k):\n"
            "    n = x.shape[0]\n"
            "    return x.sort(dim=0).values[k:n - k].sum(dim=0) / n\n",
    },
    also_correct={"efficient": _TRIMMED_MEAN_EFFICIENT.lstrip(), "literal": _TRIMMED_MEAN_LITERAL.lstrip()},
    hint="`torch.sort(x, dim=0).values`, then the mean of its rows k to N - k - 1.",
    allowed=(SORT,),
)


def _sink(g, *, n=None, s=None, singles=False, far=False, empty=0, dtype=torch.float32):
    s = randint(g, 2, 4) if s is None else s
    n = randint(g, 6, 12) if n is None else n
    if singles:  # every entry alone in its segment (some segments empty)
        s = n + randint(g, 0, 2)
        seg = torch.randperm(s, generator=g)[:n]
    else:
        seg = _segment_ids(g, n, s, empty)
    x = normal(g, n, scale=2.0, dtype=torch.float64)
    if far:  # a segment where float32's exp overflows, one about a hundred below it near 0, the rest anywhere
        offsets = torch.cat([uniform(g, 100.0, 115.0, 1, dtype=torch.float64), uniform(g, -10.0, 0.0, 1, dtype=torch.float64),
                             uniform(g, -115.0, 115.0, s - 2, dtype=torch.float64)])
        # At most 125 in absolute value: there the float32 rounding of a log-sum-exp (`exp(x - logsumexp)`, another
        # correct way) stays within half a tolerance; at 300 it is 1.5 tolerances off.
        x = (x + offsets[torch.randperm(s, generator=g)][seg]).clamp(-125.0, 125.0)
    return {"x": x.to(dtype), "seg": seg, "num_segments": s}


_SEGMENT_SINK_LITERAL = """
def segment_softmax_sink(x, seg, num_segments):
    import math
    out = torch.zeros_like(x)
    for s in range(num_segments):
        members = (seg == s).nonzero().flatten()
        if len(members) == 0:
            continue
        values = x[members]
        shift = max(values.max().item(), 0.0)  # the largest logit, the sink's 0 included
        e = torch.exp(values - shift)
        out[members] = e / (math.exp(0.0 - shift) + e.sum())
    return out
"""

# The efficiency level's budget (issue 38): the cheapest graph known, from a search of our own with the
# meter, 0.88 times the cost of the blind solver's answer that set it before (40 hidden sets).
_SEGMENT_SOFTMAX_SINK_EFFICIENT = """
import torch

def segment_softmax_sink(x, seg, num_segments):
    if x.shape[0] == 0:
        return x
    if x.dtype == torch.float64:
        e = torch.exp(x)
    else:
        b = torch.full((1,), 2.718281828459045, dtype=torch.float64)
        e = torch.pow(b, x)
    den = torch.ones(num_segments, dtype=torch.float64).index_add(0, seg, e)
    out = e / den[seg]
    return out.to(x.dtype)
"""

SEGMENT_SOFTMAX_SINK = FunctionFamily(
    "tensor_ops/segment_softmax_sink_fn", "segment_softmax_sink", ("x", "seg", "num_segments"),
    "`x` is a float tensor of shape (N,) (N >= 0; float32 or float64), `seg` an int64 tensor of shape (N,) with "
    "values in [0, num_segments), and `num_segments` a positive int. The entries with equal `seg` form a segment, "
    "wherever they are in `x` (a segment may be empty). Return the tensor of shape (N,) and the dtype of `x` whose "
    "entry `n` is the softmax of `x[n]` within its segment with one extra logit of 0 (a sink) in the denominator: "
    "`exp(x[n]) / (exp(0) + sum over m with seg[m] == seg[n] of exp(x[m]))`. So a segment's entries sum to less "
    "than 1, and a segment of one entry gets `exp(x[n]) / (1 + exp(x[n]))`. Entries lie in [-125, 125], where "
    "`exp` overflows float32 (above about 88.7), and segments may lie a hundred apart: compute it without overflow, "
    "never inf or NaN (a value too small for the dtype is 0). When N is 0 the result has shape (0,).",
    (
        Case("typical", "the softmax of `x[n]` within its segment", lambda g: _sink(g)),
        Case("one-entry segments", "a segment of one entry", lambda g: _sink(g, n=randint(g, 3, 6), singles=True)),
        Case("segments far apart", "segments may lie a hundred apart", lambda g: _sink(g, s=randint(g, 3, 4), far=True)),
        Case("empty segments", "a segment may be empty", lambda g: _sink(g, s=randint(g, 4, 6), empty=randint(g, 1, 2))),
        Case("no entries", "When N is 0", lambda g: _sink(g, n=0)),
        Case("float64 input", "float32 or float64", lambda g: _sink(g, s=randint(g, 3, 4), far=True, dtype=torch.float64)),
    ),
    "def segment_softmax_sink(x, seg, num_segments):\n"
    "    top = torch.full((num_segments,), float('-inf'), dtype=x.dtype).scatter_reduce(0, seg, x, 'amax')\n"
    "    shift = top.clamp(min=0)  # the sink's logit 0 joins the maximum\n"
    "    e = torch.exp(x - shift[seg])\n"
    "    total = torch.exp(-shift).index_add(0, seg, e)\n"
    "    return e / total[seg]\n",
    wrong={
        "no_sink":
            "def segment_softmax_sink(x, seg, num_segments):\n"
            "    top = torch.full((num_segments,), float('-inf'), dtype=x.dtype).scatter_reduce(0, seg, x, 'amax')\n"
            "    e = torch.exp(x - top[seg])\n"
            "    total = torch.zeros(num_segments, dtype=x.dtype).index_add(0, seg, e)\n"
            "    return e / total[seg]\n",
        "sink_not_shifted":
            "def segment_softmax_sink(x, seg, num_segments):\n"
            "    top = torch.full((num_segments,), float('-inf'), dtype=x.dtype).scatter_reduce(0, seg, x, 'amax')\n"
            "    e = torch.exp(x - top[seg])\n"
            "    total = torch.ones(num_segments, dtype=x.dtype).index_add(0, seg, e)\n"
            "    return e / total[seg]\n",
        "global_shift":
            "def segment_softmax_sink(x, seg, num_segments):\n"
            "    m = x.max().clamp(min=0)\n"
            "    e = torch.exp(x - m)\n"
            "    total = torch.exp(-m).repeat(num_segments).index_add(0, seg, e)\n"
            "    return e / total[seg]\n",
        "segment_order":
            "def segment_softmax_sink(x, seg, num_segments):\n"
            "    top = torch.full((num_segments,), float('-inf'), dtype=x.dtype).scatter_reduce(0, seg, x, 'amax')\n"
            "    shift = top.clamp(min=0)\n"
            "    e = torch.exp(x - shift[seg])\n"
            "    out = e / torch.exp(-shift).index_add(0, seg, e)[seg]\n"
            "    return out[torch.sort(seg, stable=True).indices]\n",
    },
    also_correct={"efficient": _SEGMENT_SOFTMAX_SINK_EFFICIENT.lstrip(),
        "literal": _SEGMENT_SINK_LITERAL.lstrip(),
        "by_hand":
            "def segment_softmax_sink(x, seg, num_segments):\n"
            "    member = seg[None, :] == torch.arange(num_segments)[:, None]\n"
            "    logits = torch.where(member, x[None, :], float('-inf'))\n"
            "    shift = torch.cat([logits, torch.zeros(num_segments, 1, dtype=x.dtype)], 1).amax(1)\n"
            "    e = torch.exp(x - shift[seg])\n"
            "    total = torch.exp(-shift) + torch.where(member, e[None, :], 0.0).sum(1)\n"
            "    return e / total[seg]\n",
        # exp(x - log-sum-exp): the float32 rounding of a log-sum-exp near 125 moves it by 0.4 tolerances
        "log_space":
            "def segment_softmax_sink(x, seg, num_segments):\n"
            "    member = seg[None, :] == torch.arange(num_segments)[:, None]\n"
            "    logits = torch.where(member, x[None, :], float('-inf'))\n"
            "    lse = torch.logsumexp(torch.cat([logits, torch.zeros(num_segments, 1, dtype=x.dtype)], 1), 1)\n"
            "    return torch.exp(x - lse[seg])\n",
    },
    hint="each segment's largest logit, the sink's 0 included, from `Tensor.scatter_reduce(..., 'amax')`; subtract "
         "it before `torch.exp`, sum with `index_add`, and add the sink's `exp(0 - shift)` to each denominator.",
    allowed=(SCATTER,),
)


def _returns(g, *, t=None, gamma=None, dones="some", dtype=torch.float32):
    t = randint(g, 5, 12) if t is None else t
    b = randint(g, 1, 3)
    done = torch.rand(t, b, generator=g) < 0.25
    if dones == "none":
        done[:] = False
    elif dones == "last" and t:  # one column's episode ends at the last step, another's (if any) does not
        columns = torch.randperm(b, generator=g)
        done[-1, columns[0]] = True
        done[-1, columns[1:2]] = False
    # Positive rewards and values: a return is a sum of positive terms, never cancelling near 0, where another
    # float32 order of the same sums would differ by a good part of the tolerance (issue 35).
    return {"r": uniform(g, 0.5, 1.5, t, b, dtype=dtype), "done": done, "last": uniform(g, 2.0, 6.0, b, dtype=dtype),
            "gamma": pick(g, [0.5, 0.9, 0.95, 0.99]) if gamma is None else gamma}


_DISCOUNTED_RETURNS_LITERAL = """
def discounted_returns(r, done, last, gamma):
    T, B = r.shape
    G = torch.zeros(T, B, dtype=r.dtype)
    for b in range(B):
        after = float(last[b])  # G[T, b]
        for t in reversed(range(T)):
            if done[t, b]:
                value = float(r[t, b])
            else:
                value = float(r[t, b]) + gamma * after
            G[t, b] = value
            after = value
    return G
"""

# The efficiency level's budget (issue 38): the cheapest graph known, from a search of our own with the
# meter, 0.59 times the cost of the blind solver's answer that set it before (40 hidden sets).
_DISCOUNTED_RETURNS_EFFICIENT = """
import torch

def discounted_returns(r, done, last, gamma):
    T = r.shape[0]
    if T == 0 or gamma == 0.0:
        return r
    nd = done.logical_not()
    rs = r.unbind(0)
    ns = nd.unbind(0)
    outs = [None] * T
    g = last
    for t in range(T - 1, -1, -1):
        g = torch.addcmul(rs[t], ns[t], g, value=gamma)
        outs[t] = g
    return torch.stack(outs, 0)
"""

DISCOUNTED_RETURNS = FunctionFamily(
    "tensor_ops/discounted_returns_fn", "discounted_returns", ("r", "done", "last", "gamma"),
    "`r` is a float tensor of shape (T, B) of rewards (T >= 0, B >= 1; float32 or float64), `done` a bool tensor "
    "of shape (T, B), `last` a float tensor of shape (B,) of the dtype of `r` (the value of the state after the "
    "last step), and `gamma` a Python float in [0, 1]. Return the discounted returns `G`, of the shape and dtype of "
    "`r`, computed backwards in time for each column `b` on its own: `G[t, b] = r[t, b] + gamma * G[t + 1, b]`, "
    "where `G[T, b]` is `last[b]`; except that where `done[t, b]` is True the episode ends at step t and `G[t, b] "
    "= r[t, b]` (nothing after step t counts: neither later rewards nor `last`). With gamma = 0, G is `r`; with "
    "gamma = 1 the rewards are summed undiscounted. When T is 0 the result has shape (0, B).",
    (
        Case("typical", "the discounted returns", lambda g: _returns(g)),
        Case("episode ends at the last step", "neither later rewards nor `last`", lambda g: _returns(g, dones="last")),
        Case("no episode ends", "where `G[T, b]` is `last[b]`", lambda g: _returns(g, dones="none")),
        Case("gamma 0", "With gamma = 0", lambda g: _returns(g, gamma=0.0)),
        Case("gamma 1", "with gamma = 1", lambda g: _returns(g, gamma=1.0)),
        Case("no steps", "When T is 0", lambda g: _returns(g, t=0)),
        Case("float64 input", "float32 or float64", lambda g: _returns(g, dones="last", dtype=torch.float64)),
    ),
    "def discounted_returns(r, done, last, gamma):\n"
    "    G = torch.empty_like(r)\n"
    "    after = last\n"
    "    for t in range(r.shape[0] - 1, -1, -1):\n"
    "        after = torch.where(done[t], r[t], r[t] + gamma * after)\n"
    "        G[t] = after\n"
    "    return G\n",
    wrong={
        "done_of_next_step":
            "def discounted_returns(r, done, last, gamma):\n"
            "    T = r.shape[0]\n"
            "    G = torch.empty_like(r)\n"
            "    after = last\n"
            "    for t in range(T - 1, -1, -1):\n"
            "        ends = done[t + 1] if t + 1 < T else torch.zeros_like(done[t])\n"
            "        after = r[t] + gamma * after * ~ends\n"
            "        G[t] = after\n"
            "    return G\n",
        "no_bootstrap":
            "def discounted_returns(r, done, last, gamma):\n"
            "    G = torch.empty_like(r)\n"
            "    after = torch.zeros_like(last)\n"
            "    for t in range(r.shape[0] - 1, -1, -1):\n"
            "        after = torch.where(done[t], r[t], r[t] + gamma * after)\n"
            "        G[t] = after\n"
            "    return G\n",
        "bootstraps_after_done":
            "def discounted_returns(r, done, last, gamma):\n"
            "    T = r.shape[0]\n"
            "    G = torch.empty_like(r)\n"
            "    after = last\n"
            "    for t in range(T - 1, -1, -1):\n"
            "        after = r[t] + gamma * after if t == T - 1 else torch.where(done[t], r[t], r[t] + gamma * after)\n"
            "        G[t] = after\n"
            "    return G\n",
    },
    also_correct={"efficient": _DISCOUNTED_RETURNS_EFFICIENT.lstrip(), "literal": _DISCOUNTED_RETURNS_LITERAL.lstrip()},
    hint="loop over t from T - 1 down to 0, carrying the next step's return, with `torch.where(done[t], ...)`.",
)


FAMILIES = [SEGMENT_MEAN, MASKED_SOFTMAX, PAIRWISE_DISTANCE, TOPK_KEEP, DIVISION_MODES, LOGSUMEXP, CAUSAL_ATTENTION,
            BATCH_NORM, GROUP_NORM, STRAIGHT_THROUGH, LABEL_SMOOTHING, GRAD_ACCUMULATION, TRIMMED_MEAN,
            SEGMENT_SOFTMAX_SINK, DISCOUNTED_RETURNS]
