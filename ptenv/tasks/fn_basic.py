"""Function families of the basic tier (ptenv/tasks/functions.py): the canonical tasks
(ptenv/tasks/canonical.py) as functions over any valid input, with the edge cases their fixed
inputs avoid."""

import torch

from ptenv.tasks.families import normal, pick, randint, uniform
from ptenv.tasks.allowed import SORT
from ptenv.tasks.functions import Case, FunctionFamily


def _grid(g, *shape, low=-8, high=8, step=0.5, dtype=torch.float32):
    """Multiples of `step` in [low * step, high * step]: ties and exact thresholds occur."""
    return (torch.randint(low, high + 1, shape, generator=g) * step).to(dtype)


# ---------------------------------------------------------------- tensor_ops


def _std(g, n=None, d=None, dtype=torch.float32, constant=False):
    n = randint(g, 3, 8) if n is None else n
    d = randint(g, 2, 5) if d is None else d
    x = normal(g, n, d, dtype=dtype) + 0.5
    if constant:
        x[:, randint(g, 0, d - 1)] = randint(g, -8, 8) * 0.25
    return {"x": x}


_COLUMN_STD_LITERAL = """
def column_std(x):
    n = x.shape[0]
    mean = x.sum(0) / n
    return (((x - mean) ** 2).sum(0) / (n - 1)).sqrt()
"""

COLUMN_STD = FunctionFamily(
    "tensor_ops/column_std_unbiased_fn", "column_std", ("x",),
    "`x` is a float tensor of shape (N, D) (N >= 2, D >= 1; float32 or float64). Return the tensor of shape "
    "(D,) and the dtype of `x` whose entry `d` is the sample standard deviation of the column `x[:, d]` with "
    "Bessel's correction: the square root of the sum of squared deviations from the column mean, divided by "
    "N - 1 (not N). With exactly two rows (N = 2) that is `|x[0, d] - x[1, d]| / sqrt(2)`. A column whose "
    "entries are all equal gets 0.",
    (
        Case("typical", "the sample standard deviation", lambda g: _std(g)),
        Case("two rows", "exactly two rows", lambda g: _std(g, n=2)),
        Case("one column", "D >= 1", lambda g: _std(g, d=1)),
        Case("constant column", "all equal gets 0", lambda g: _std(g, constant=True)),
        Case("float64 input", "float32 or float64", lambda g: _std(g, dtype=torch.float64)),
    ),
    "def column_std(x):\n"
    "    return x.std(dim=0)\n",
    wrong={
        "biased":
            "def column_std(x):\n"
            "    return x.std(dim=0, correction=0)\n",
        "float32_always":
            "def column_std(x):\n"
            "    return x.float().std(dim=0)\n",
    },
    also_correct={"literal": _COLUMN_STD_LITERAL.lstrip(),
                  "by_hand": 'def column_std(x):\n    d = x - x.mean(0)\n    return ((d * d).sum(0) / (x.shape[0] - 1)).sqrt()\n'},
    hint="`Tensor.std` (its default correction is Bessel's).",
)


def _argsort(g, shape, ties=False, dtype=torch.float32):
    if ties:
        return {"x": _grid(g, *shape, low=-3, high=3, dtype=dtype)}
    return {"x": normal(g, *shape, dtype=dtype)}


_ARGSORT_ROWS_LITERAL = """
def argsort_rows(x):
    n = x.shape[-1]
    position = torch.arange(n)
    a, b = x.unsqueeze(-1), x.unsqueeze(-2)  # a: element i, b: element j
    # j sorts before i when it is smaller, or equal and at a lower index
    before = (b < a) | ((b == a) & (position[None, :] < position[:, None]))
    rank = before.sum(-1)
    return torch.empty_like(rank).scatter_(-1, rank, position.expand_as(rank).contiguous())
"""

ARGSORT_ROWS = FunctionFamily(
    "tensor_ops/argsort_rows_fn", "argsort_rows", ("x",),
    "`x` is a tensor of rank 1, 2 or 3 (float32, float64 or int64) whose last dimension has size >= 1. Return "
    "the int64 tensor of the shape of `x` whose every 1-D slice along the last dimension holds the indices "
    "that sort that slice of `x` in ascending order (so `x.gather(-1, result)` is sorted ascending along the "
    "last dimension). Equal values (ties) keep their original order: the lower index comes first.",
    (
        Case("distinct values", "sort that slice", lambda g: _argsort(g, (randint(g, 2, 4), randint(g, 3, 7)))),
        Case("tied values", "Equal values (ties)", lambda g: _argsort(g, (randint(g, 2, 4), randint(g, 5, 9)), ties=True)),
        Case("int64 input", "int64)", lambda g: _argsort(g, (randint(g, 2, 4), randint(g, 5, 9)), ties=True, dtype=torch.int64)),
        Case("rank 1", "rank 1, 2 or 3", lambda g: _argsort(g, (randint(g, 6, 12),), ties=True)),
        Case("rank 3", "rank 1, 2 or 3", lambda g: _argsort(g, (2, randint(g, 2, 3), randint(g, 4, 7)), ties=True)),
    ),
    "def argsort_rows(x):\n"
    "    return torch.argsort(x, dim=-1, stable=True)\n",
    wrong={
        "descending":
            "def argsort_rows(x):\n"
            "    return torch.argsort(x, dim=-1, descending=True, stable=True)\n",
        "ties_high_index_first":
            "def argsort_rows(x):\n"
            "    return x.shape[-1] - 1 - torch.argsort(x.flip(-1), dim=-1, stable=True)\n",
        "dim_1":
            "def argsort_rows(x):\n"
            "    return torch.argsort(x, dim=1 if x.dim() > 1 else 0, stable=True)\n",
    },
    also_correct={"literal": _ARGSORT_ROWS_LITERAL.lstrip(),
                  "by_hand": 'def argsort_rows(x):\n    n = x.shape[-1]\n    i = torch.arange(n)\n    # j comes before i: a smaller value, or an equal one at a lower index\n    before = (x.unsqueeze(-2) < x.unsqueeze(-1)) | ((x.unsqueeze(-2) == x.unsqueeze(-1)) & (i[None, :] < i[:, None]))\n    rank = before.sum(-1).reshape(-1, n)\n    out = torch.empty_like(rank)\n    out[torch.arange(rank.shape[0])[:, None].expand_as(rank), rank] = i.expand_as(rank)\n    return out.reshape(x.shape)\n'},
    hint="`torch.argsort(..., stable=True)`.",
)


def _select(g, shape, dtype=torch.float32, *, equal=False, none=False):
    if dtype == torch.int64:
        x = torch.randint(-9, 10, shape, generator=g)
        threshold = float(randint(g, -3, 3)) + pick(g, [0.0, 0.5])
    else:
        x = _grid(g, *shape, step=0.25, dtype=dtype)
        threshold = randint(g, -4, 4) * 0.25
    if equal:
        x.view(-1)[torch.randperm(x.numel(), generator=g)[:2]] = threshold
    if none:
        threshold = float(x.max()) + pick(g, [0.0, 0.25, 1.0])
    return {"x": x, "threshold": threshold}


_MASKED_SELECT_LITERAL = """
def select_greater(x, threshold):
    kept = [v for v in x.flatten().tolist() if v > threshold]
    return torch.tensor(kept, dtype=x.dtype)
"""

MASKED_SELECT = FunctionFamily(
    "tensor_ops/masked_select_fn", "select_greater", ("x", "threshold"),
    "`x` is a tensor of rank 1, 2 or 3 (float32, float64 or int64) and `threshold` a Python float that float32 holds "
    "exactly (such as 0.75 or -2.5; int64 entries are below 2 ** 24 in absolute value), so comparing in the dtype "
    "of `x`, in float32 or exactly gives the same answer. Return the "
    "1-D tensor, of the dtype of `x`, of the elements of `x` that are strictly greater than `threshold`, in "
    "row-major order (the order of `x.flatten()`). Elements equal to `threshold` are not selected. When no "
    "element is selected the result is empty, of shape (0,).",
    (
        Case("typical", "strictly greater than", lambda g: _select(g, (randint(g, 2, 4), randint(g, 3, 6)))),
        Case("values equal to the threshold", "equal to `threshold` are not selected",
             lambda g: _select(g, (randint(g, 2, 4), randint(g, 3, 6)), equal=True)),
        Case("nothing selected", "no element is selected", lambda g: _select(g, (randint(g, 2, 4), randint(g, 2, 5)), none=True)),
        Case("int64 input", "int64)", lambda g: _select(g, (randint(g, 2, 4), randint(g, 3, 6)), torch.int64)),
        Case("rank 3", "rank 1, 2 or 3", lambda g: _select(g, (2, randint(g, 2, 3), randint(g, 2, 4)), equal=True)),
        Case("float64 input", "float32, float64", lambda g: _select(g, (randint(g, 5, 12),), torch.float64, equal=True)),
    ),
    "def select_greater(x, threshold):\n"
    "    return x[x > threshold]\n",
    wrong={
        "greater_or_equal":
            "def select_greater(x, threshold):\n"
            "    return x[x >= threshold]\n",
        "column_major":
            "def select_greater(x, threshold):\n"
            "    t = x.permute(*reversed(range(x.dim())))\n"
            "    return t[t > threshold]\n",
        "float_output":
            "def select_greater(x, threshold):\n"
            "    return x[x > threshold].float()\n",
    },
    also_correct={"literal": _MASKED_SELECT_LITERAL.lstrip(),
                  "by_hand": 'def select_greater(x, threshold):\n    flat = x.flatten()\n    keep = flat > threshold\n    order = torch.sort((~keep).long(), stable=True).indices[:int(keep.sum())]\n    return flat[order]\n'},
    hint="boolean-mask indexing, or `torch.masked_select`.",
    allowed=(SORT,),
    banned=("nonzero", "masked_select"),
)


def _cast(g, dtype=torch.float32, negative=False, whole=False):
    shape = (randint(g, 2, 4), randint(g, 2, 5))
    x = uniform(g, -6.0, 6.0, *shape, dtype=torch.float64)
    if negative:
        x = -x.abs() - 0.05
    if whole:
        x = x.round()
        x[0, 0] = -x[0, 0].abs() - 1.0
        x = x + torch.where(torch.rand(shape, generator=g) < 0.5, 0.0, -0.5)
    return {"x": x.to(dtype), "dtype": pick(g, ["int16", "int32", "int64"])}


_CAST_TRUNC_LITERAL = """
def to_int(x, dtype):
    truncated = torch.where(x < 0, torch.ceil(x), torch.floor(x))
    return truncated.to(getattr(torch, dtype))
"""

CAST_TRUNC = FunctionFamily(
    "tensor_ops/cast_trunc_int_fn", "to_int", ("x", "dtype"),
    "`x` is a float tensor of any shape (float32 or float64) whose entries have absolute value below 30000, and "
    "`dtype` one of the strings 'int16', 'int32' or 'int64'. Return the tensor of the shape of `x` and the "
    "integer dtype `dtype` names (torch.int16, torch.int32 or torch.int64) whose entries are those of `x` "
    "with the fraction truncated toward zero: 2.7 gives 2 and -2.7 gives -2 (negative entries are rounded up, "
    "not down); an entry that is already a whole number, or a negative half such as -3.5, follows the same rule "
    "(-3.5 gives -3).",
    (
        Case("typical", "truncated toward zero", lambda g: _cast(g)),
        Case("negative entries", "negative entries are rounded up", lambda g: _cast(g, negative=True)),
        Case("whole numbers and halves", "a negative half", lambda g: _cast(g, whole=True)),
        Case("float64 input", "float32 or float64", lambda g: _cast(g, torch.float64)),
    ),
    "def to_int(x, dtype):\n"
    "    return torch.trunc(x).to(getattr(torch, dtype))\n",
    wrong={
        "floor":
            "def to_int(x, dtype):\n"
            "    return torch.floor(x).to(getattr(torch, dtype))\n",
        "round":
            "def to_int(x, dtype):\n"
            "    return torch.round(x).to(getattr(torch, dtype))\n",
        "int64_always":
            "def to_int(x, dtype):\n"
            "    return torch.trunc(x).long()\n",
    },
    also_correct={"literal": _CAST_TRUNC_LITERAL.lstrip()},
    hint="`torch.trunc`, then `Tensor.to` with the dtype `getattr(torch, dtype)`.",
)

# ---------------------------------------------------------------- nn_modules


def _pool(g, *, include=True, padding=None, batched=True, dtype=torch.float32):
    k = pick(g, [2, 3])
    padding = randint(g, 1, k // 2) if padding is None else padding
    stride = 2
    size = 2 * randint(g, 2, 4) + (1 if (k + 2 * padding) % 2 == 0 else 0)  # (size + 2p - k) is odd: a remainder
    shape = (randint(g, 1, 2), randint(g, 1, 2), size, size + 1) if batched else (randint(g, 1, 3), size, size)
    return {"x": normal(g, *shape, dtype=dtype) + 0.5, "kernel_size": k, "stride": stride, "padding": padding,
            "count_include_pad": include}


_AVG_POOL_LITERAL = """
def avg_pool(x, kernel_size, stride, padding, count_include_pad):
    k, s, p = kernel_size, stride, padding
    batched = x.dim() == 4
    if not batched:
        x = x[None]
    N, C, H, W = x.shape
    padded = torch.zeros(N, C, H + 2 * p, W + 2 * p, dtype=x.dtype)
    padded[:, :, p:p + H, p:p + W] = x
    inside = torch.zeros(H + 2 * p, W + 2 * p, dtype=x.dtype)
    inside[p:p + H, p:p + W] = 1
    # every k x k window moving by s: (N, C, OH, OW, k, k); a partial window at the end is dropped
    total = padded.unfold(2, k, s).unfold(3, k, s).sum((-2, -1))
    count = inside.unfold(0, k, s).unfold(1, k, s).sum((-2, -1)) if not count_include_pad else k * k
    out = total / count
    return out if batched else out[0]
"""

AVG_POOL = FunctionFamily(
    "nn_modules/avg_pool_fn", "avg_pool", ("x", "kernel_size", "stride", "padding", "count_include_pad"),
    "`x` is a float tensor of shape (N, C, H, W), or an unbatched (C, H, W) (float32 or float64); `kernel_size`, "
    "`stride` and `padding` are positive ints except `padding`, which may be 0 and is at most `kernel_size // 2`, "
    "and H + 2 * padding >= kernel_size (likewise W). `count_include_pad` is a bool. Return the 2-D average "
    "pooling of `x` with a square `kernel_size` window moving by `stride` in both directions over `x` "
    "zero-padded by `padding` on every side, as `torch.nn.AvgPool2d(kernel_size, stride, padding, "
    "count_include_pad=count_include_pad)` computes it (ceil_mode False): the output has (H + 2 * padding - "
    "kernel_size) // stride + 1 rows (rounded down: a partial window at the end is dropped), likewise for "
    "columns, and the dtype of `x`, and the batch dimension only when `x` has one. When `count_include_pad` "
    "is True each window's sum is divided by kernel_size ** 2 (padded zeros count); when it is False, padded "
    "zeros are not counted: it is divided by the number of the window's positions that lie inside `x`.",
    (
        Case("typical", "average pooling", lambda g: _pool(g)),
        Case("padding not counted", "padded zeros are not counted", lambda g: _pool(g, include=False)),
        Case("no padding", "may be 0", lambda g: _pool(g, padding=0, include=pick(g, [True, False]))),
        Case("unbatched input", "unbatched (C, H, W)", lambda g: _pool(g, batched=False, include=False)),
        Case("float64 input", "float32 or float64", lambda g: _pool(g, dtype=torch.float64)),
    ),
    "def avg_pool(x, kernel_size, stride, padding, count_include_pad):\n"
    "    return torch.nn.functional.avg_pool2d(x, kernel_size, stride, padding, ceil_mode=False,\n"
    "                                          count_include_pad=count_include_pad)\n",
    wrong={
        "padding_always_counted":
            "def avg_pool(x, kernel_size, stride, padding, count_include_pad):\n"
            "    return torch.nn.functional.avg_pool2d(x, kernel_size, stride, padding)\n",
        "ceil_mode":
            "def avg_pool(x, kernel_size, stride, padding, count_include_pad):\n"
            "    return torch.nn.functional.avg_pool2d(x, kernel_size, stride, padding, ceil_mode=True,\n"
            "                                          count_include_pad=count_include_pad)\n",
    },
    also_correct={"literal": _AVG_POOL_LITERAL.lstrip(),
                  "by_hand": 'def avg_pool(x, kernel_size, stride, padding, count_include_pad):\n    k, s, p = kernel_size, stride, padding\n    H, W = x.shape[-2:]\n    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1\n    xp = torch.nn.functional.pad(x, (p, p, p, p))\n    inside = torch.nn.functional.pad(torch.ones(H, W, dtype=x.dtype), (p, p, p, p))\n    total, count = 0, 0\n    for i in range(k):\n        for j in range(k):\n            total = total + xp[..., i:i + s * (OH - 1) + 1:s, j:j + s * (OW - 1) + 1:s]\n            count = count + inside[i:i + s * (OH - 1) + 1:s, j:j + s * (OW - 1) + 1:s]\n    return total / (k * k) if count_include_pad else total / count\n'},
    hint="`torch.nn.functional.avg_pool2d`.",
)


def _log_softmax(g, shape, dim, *, offset=0.0, dtype=torch.float32):
    x = normal(g, *shape, scale=1.5) + offset
    # A slice whose largest entry is far above the rest has a log-softmax near 0 there: -log(1 + e) of a sum that
    # float32 rounds to 1.2e-7, in a way the summation order decides, against a tolerance of 1e-7 + 1e-5 |result|.
    # Such a slice has its largest entry lowered to its second largest, so no result but an exact 0 is below
    # 0.1 in magnitude (issue 35).
    exact = x.double()
    top = exact.topk(min(2, x.shape[dim]), dim).values
    first, second = top.narrow(dim, 0, 1), top.narrow(dim, top.shape[dim] - 1, 1)
    dominant = (exact - first).exp().sum(dim, keepdim=True).log() < 0.1
    x = torch.where(dominant & (exact == first), second, exact)
    return {"x": x.to(dtype), "dim": dim}


def _large_offset(g):
    return uniform(g, 150.0, 600.0, 1).item() * pick(g, [-1.0, 1.0])


_LOG_SOFTMAX_LITERAL = """
def log_softmax(x, dim):
    m = x.amax(dim, keepdim=True)
    return (x - m) - torch.log(torch.exp(x - m).sum(dim, keepdim=True))
"""

LOG_SOFTMAX = FunctionFamily(
    "nn_modules/log_softmax_rows_fn", "log_softmax", ("x", "dim"),
    "`x` is a float tensor of rank 1, 2 or 3 (float32 or float64) and `dim` an int in [-rank, rank) (a negative "
    "dim counts from the end); the size of `x` along `dim` is >= 1. Return the tensor of the shape and dtype of "
    "`x` holding the log-softmax of `x` along `dim`: `x[..., j, ...] - log(sum over k of exp(x[..., k, ...]))`, "
    "the sum along `dim`. Along a size-1 dimension every entry is 0. Entries of `x` may be in the hundreds (of "
    "either sign): the result must neither overflow nor underflow, and must be as accurate as "
    "`(x - m) - log(sum(exp(x - m)))` with `m` the maximum along `dim`, computed in the dtype of `x` (subtracting "
    "a log-sum-exp that was first rounded to the dtype of `x` from `x` loses digits).",
    (
        Case("typical", "log-softmax of `x` along `dim`",
             lambda g: _log_softmax(g, (randint(g, 2, 4), randint(g, 3, 6)), randint(g, 0, 1))),
        Case("values in the hundreds", "in the hundreds",
             lambda g: _log_softmax(g, (randint(g, 2, 4), randint(g, 3, 6)), randint(g, 0, 1), offset=_large_offset(g))),
        Case("negative dim", "a negative dim",
             lambda g: _log_softmax(g, (randint(g, 2, 3), randint(g, 2, 4), randint(g, 2, 4)), pick(g, [-2, -3]))),
        Case("size-1 dimension", "size-1 dimension", lambda g: _log_softmax(g, (randint(g, 2, 4), 1), pick(g, [1, -1]))),
        Case("float64 input", "float32 or float64",
             lambda g: _log_softmax(g, (randint(g, 4, 9),), pick(g, [0, -1]), offset=_large_offset(g), dtype=torch.float64)),
    ),
    "def log_softmax(x, dim):\n"
    "    return torch.log_softmax(x, dim=dim)\n",
    wrong={
        "naive":
            "def log_softmax(x, dim):\n"
            "    e = torch.exp(x)\n"
            "    return torch.log(e / e.sum(dim, keepdim=True))\n",
        "last_dim_always":
            "def log_softmax(x, dim):\n"
            "    return torch.log_softmax(x, dim=-1)\n",
        "logsumexp_rounded":
            "def log_softmax(x, dim):\n"
            "    return x - torch.logsumexp(x, dim, keepdim=True)\n",
    },
    also_correct={"literal": _LOG_SOFTMAX_LITERAL.lstrip(),
                  "by_hand": 'def log_softmax(x, dim):\n    m = x.amax(dim, keepdim=True)\n    return (x - m) - torch.log(torch.exp(x - m).sum(dim, keepdim=True))\n'},
    hint="`torch.log_softmax`.",
)

# ---------------------------------------------------------------- autograd


def _accumulate(g, powers, shape=None, dtype=torch.float32):
    shape = (randint(g, 3, 8),) if shape is None else shape
    magnitude = uniform(g, 0.2, 1.6, torch.Size(shape).numel(), dtype=dtype).reshape(shape)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1, 1).to(dtype)
    return {"x": magnitude * sign, "powers": powers}


_GRAD_ACCUMULATES_LITERAL = """
def accumulated_grad(x, powers):
    with torch.enable_grad():
        x = x.detach().clone().requires_grad_()
        for p in powers:
            (x ** p).sum().backward()
    return x.grad if x.grad is not None else torch.zeros_like(x)
"""

GRAD_ACCUMULATES = FunctionFamily(
    "autograd/grad_accumulates_fn", "accumulated_grad", ("x", "powers"),
    "`x` is a float tensor of any shape, including a 0-dim scalar (float32 or float64), and `powers` a list of "
    "ints >= 1, possibly empty and possibly with repeats. Return what `x.grad` holds (as a tensor of the shape "
    "and dtype of `x`) after making `x` a leaf that requires grad and calling `(x ** p).sum().backward()` for "
    "each `p` in `powers` in turn, without zeroing the gradient in between: gradients accumulate, so the "
    "result is the sum over `powers` of `p * x ** (p - 1)` (a repeated power counts each time). With an empty "
    "`powers` list the result is a tensor of zeros (never None). Autograd may be used.",
    (
        Case("typical", "in turn", lambda g: _accumulate(g, [randint(g, 1, 2), randint(g, 3, 4)])),
        Case("empty powers", "an empty `powers` list", lambda g: _accumulate(g, [])),
        Case("repeated power", "a repeated power", lambda g: _accumulate(g, [2, 3, 2] if randint(g, 0, 1) else [3, 3])),
        Case("scalar input", "0-dim scalar", lambda g: _accumulate(g, [randint(g, 2, 4), 1], shape=())),
        Case("rank 2 float64", "float32 or float64",
             lambda g: _accumulate(g, [randint(g, 2, 3), randint(g, 4, 5)], (randint(g, 2, 3), randint(g, 2, 4)), torch.float64)),
    ),
    "def accumulated_grad(x, powers):\n"
    "    total = torch.zeros_like(x)\n"
    "    for p in powers:\n"
    "        total = total + p * x ** (p - 1)\n"
    "    return total\n",
    wrong={
        "none_when_empty":
            "def accumulated_grad(x, powers):\n"
            "    x = x.clone().requires_grad_()\n"
            "    for p in powers:\n"
            "        (x ** p).sum().backward()\n"
            "    return x.grad\n",
        "last_only":
            "def accumulated_grad(x, powers):\n"
            "    total = torch.zeros_like(x)\n"
            "    for p in powers:\n"
            "        total = p * x ** (p - 1)\n"
            "    return total\n",
        "distinct_powers":
            "def accumulated_grad(x, powers):\n"
            "    total = torch.zeros_like(x)\n"
            "    for p in set(powers):\n"
            "        total = total + p * x ** (p - 1)\n"
            "    return total\n",
    },
    also_correct={"literal": _GRAD_ACCUMULATES_LITERAL.lstrip()},
    hint="a leaf with `requires_grad_()` and repeated `backward()`, or the derivative by hand.",
)

# ---------------------------------------------------------------- losses


def _ce(g, *, ignored=False, large=False, c=None, dtype=torch.float32):
    n, c = randint(g, 3, 7), randint(g, 3, 6) if c is None else c
    logits = normal(g, n, c, scale=2.0)
    if large:
        # Spread as the typical ones (issue 35): a spread of 40 gave losses near 1e-7, a sum of exps of 1 + 1e-7
        # whose float32 rounding, which the summation order decides, moved the loss by more than the tolerance.
        logits = logits + uniform(g, 1000.0, 3000.0, 1).item() * pick(g, [-1.0, 1.0])
    target = torch.randint(0, c, (n,), generator=g)
    ignore_index = pick(g, [-100, -1, c - 1]) if ignored else -100
    if ignored and ignore_index < 0:
        target[torch.randperm(n, generator=g)[: randint(g, 1, n - 1)]] = ignore_index
    elif ignored:
        target[randint(g, 0, n - 1)] = ignore_index
    if c > 1:
        # A loss below 0.1 (a target logit far above the rest) is log(1 + e) of a sum 1 + e that float32 rounds to
        # 1.2e-7, in a way the summation order decides, against a tolerance of 1e-7 + 1e-5 * loss: such a sample
        # takes the class of its smallest logit (not ignore_index) as its target instead (issue 35).
        drawn = logits.to(dtype).double()
        kept = target != ignore_index
        loss = drawn.logsumexp(1) - drawn.gather(1, target.clamp(0, c - 1)[:, None]).squeeze(1)
        lowest = drawn.masked_fill(torch.arange(c) == ignore_index, float("inf")).argmin(1)
        target = torch.where(kept & (loss < 0.1), lowest, target)
    return {"logits": logits.to(dtype), "target": target, "ignore_index": ignore_index}


_CROSS_ENTROPY_LITERAL = """
def cross_entropy(logits, target, ignore_index):
    N, C = logits.shape
    m = logits.amax(1)
    lse = torch.log(torch.exp(logits - m[:, None]).sum(1))
    ignored = target == ignore_index
    t = torch.where(ignored, torch.zeros_like(target), target)
    loss = lse - (logits[torch.arange(N), t] - m)
    return torch.where(ignored, torch.zeros_like(loss), loss)
"""

CROSS_ENTROPY = FunctionFamily(
    "losses/cross_entropy_per_sample_fn", "cross_entropy", ("logits", "target", "ignore_index"),
    "`logits` is a float tensor of shape (N, C) (N >= 1, C >= 1; float32 or float64), `target` an int64 tensor of "
    "shape (N,), and `ignore_index` an int. Every `target[n]` is either in [0, C) or equal to `ignore_index`; "
    "`ignore_index` may be negative (like -100) or itself a valid class in [0, C). Return the tensor of shape "
    "(N,) and the dtype of `logits` whose entry `n` is the cross-entropy of sample `n`, "
    "`-log_softmax(logits[n])[target[n]]` (as `torch.nn.CrossEntropyLoss(reduction='none')`), except that a "
    "sample whose target equals `ignore_index` gets exactly 0. With one class (C = 1) every loss is 0. Logits may "
    "be in the thousands (of either sign): the result must neither overflow nor underflow, and must be as "
    "accurate as `log(sum(exp(l - m))) - (l[t] - m)` with `m` the row's maximum, computed in the dtype of `logits`.",
    (
        Case("typical", "the cross-entropy of sample", lambda g: _ce(g)),
        Case("ignored samples", "equals `ignore_index` gets exactly 0", lambda g: _ce(g, ignored=True)),
        Case("large logits", "in the thousands", lambda g: _ce(g, large=True)),
        Case("one class", "With one class", lambda g: _ce(g, c=1)),
        Case("float64 input", "float32 or float64", lambda g: _ce(g, ignored=True, large=True, dtype=torch.float64)),
    ),
    "def cross_entropy(logits, target, ignore_index):\n"
    "    return torch.nn.functional.cross_entropy(logits, target, ignore_index=ignore_index, reduction='none')\n",
    wrong={
        "naive_softmax":
            "def cross_entropy(logits, target, ignore_index):\n"
            "    keep = target != ignore_index\n"
            "    p = torch.exp(logits) / torch.exp(logits).sum(1, keepdim=True)\n"
            "    t = torch.where(keep, target, 0)\n"
            "    return torch.where(keep, -torch.log(p.gather(1, t[:, None]).squeeze(1)), torch.zeros(()).to(logits.dtype))\n",
        "ignore_index_dropped":
            "def cross_entropy(logits, target, ignore_index):\n"
            "    t = target.clamp(min=0)\n"
            "    return -torch.log_softmax(logits, 1).gather(1, t[:, None]).squeeze(1)\n",
        "logsumexp_rounded":
            "def cross_entropy(logits, target, ignore_index):\n"
            "    keep = target != ignore_index\n"
            "    t = torch.where(keep, target, 0)\n"
            "    loss = torch.logsumexp(logits, 1) - logits.gather(1, t[:, None]).squeeze(1)\n"
            "    return torch.where(keep, loss, torch.zeros_like(loss))\n",
    },
    also_correct={"literal": _CROSS_ENTROPY_LITERAL.lstrip(),
                  "by_hand": 'def cross_entropy(logits, target, ignore_index):\n    keep = target != ignore_index\n    t = torch.where(keep, target, torch.zeros_like(target))\n    shifted = logits - logits.amax(1, keepdim=True)\n    loss = torch.log(torch.exp(shifted).sum(1)) - shifted.gather(1, t[:, None]).squeeze(1)\n    return torch.where(keep, loss, torch.zeros_like(loss))\n'},
    hint="`torch.nn.functional.cross_entropy` with `ignore_index` and `reduction='none'`.",
)


def _smooth(g, *, beta=None, reduction="none", dtype=torch.float32):
    shape = (randint(g, 2, 4), randint(g, 2, 5))
    beta = pick(g, [0.25, 0.5, 2.0]) if beta is None else beta
    pred = normal(g, *shape, scale=1.5)
    target = pred + normal(g, *shape, scale=max(beta, 0.5) * 1.5)
    return {"pred": pred.to(dtype), "target": target.to(dtype), "beta": beta, "reduction": reduction}


_SMOOTH_L1_LITERAL = """
def smooth_l1(pred, target, beta, reduction):
    d = pred - target
    if beta == 0:
        loss = d.abs()
    else:
        loss = torch.where(d.abs() < beta, 0.5 * d ** 2 / beta, d.abs() - 0.5 * beta)
    if reduction == 'mean':
        return loss.sum() / loss.numel()
    if reduction == 'sum':
        return loss.sum()
    return loss
"""

SMOOTH_L1 = FunctionFamily(
    "losses/smooth_l1_fn", "smooth_l1", ("pred", "target", "beta", "reduction"),
    "`pred` and `target` are float tensors of the same shape (any rank >= 1, at least one element; float32 or "
    "float64), `beta` a Python float >= 0, and `reduction` one of 'none', 'mean', 'sum'. With `d = pred - "
    "target`, the element-wise loss is `0.5 * d ** 2 / beta` where `|d| < beta` and `|d| - 0.5 * beta` elsewhere "
    "(as `torch.nn.SmoothL1Loss(beta=beta)`; note it is not Huber's `beta * (|d| - 0.5 * beta)`). With beta 0 "
    "it is `|d|` everywhere (no division by zero). Return, in the dtype of `pred`: for 'none' the element-wise "
    "losses (the shape of `pred`); for 'mean' their mean over all elements and for 'sum' their sum, each as a "
    "0-dim tensor.",
    (
        Case("typical", "the element-wise loss", lambda g: _smooth(g)),
        Case("beta 0", "With beta 0", lambda g: _smooth(g, beta=0.0)),
        Case("mean reduction", "for 'mean'", lambda g: _smooth(g, reduction="mean")),
        Case("sum reduction", "'sum' their sum", lambda g: _smooth(g, reduction="sum")),
        Case("float64 input", "float32 or float64", lambda g: _smooth(g, dtype=torch.float64, reduction=pick(g, ["none", "mean"]))),
    ),
    "def smooth_l1(pred, target, beta, reduction):\n"
    "    return torch.nn.functional.smooth_l1_loss(pred, target, reduction=reduction, beta=beta)\n",
    wrong={
        "huber":
            "def smooth_l1(pred, target, beta, reduction):\n"
            "    return torch.nn.functional.huber_loss(pred, target, reduction=reduction, delta=max(beta, 1e-12))\n",
        "reduction_ignored":
            "def smooth_l1(pred, target, beta, reduction):\n"
            "    return torch.nn.functional.smooth_l1_loss(pred, target, reduction='none', beta=beta)\n",
    },
    also_correct={"literal": _SMOOTH_L1_LITERAL.lstrip(),
                  "by_hand": "def smooth_l1(pred, target, beta, reduction):\n    d = (pred - target).abs()\n    loss = torch.where(d < beta, 0.5 * d * d / max(beta, 1e-30), d - 0.5 * beta)\n    return loss.mean() if reduction == 'mean' else loss.sum() if reduction == 'sum' else loss\n"},
    hint="`torch.nn.functional.smooth_l1_loss`.",
)

# ---------------------------------------------------------------- optim


def _sgd(g, *, momentum=None, dampening=0.0, nesterov=False, steps=None, dtype=torch.float32):
    n, d, o = randint(g, 3, 6), randint(g, 2, 4), randint(g, 1, 3)
    momentum = pick(g, [0.5, 0.8, 0.9]) if momentum is None else momentum
    return {"w": normal(g, o, d, scale=0.5, dtype=dtype), "x": normal(g, n, d, dtype=dtype),
            "y": normal(g, n, o, dtype=dtype), "lr": pick(g, [0.05, 0.1, 0.2]), "momentum": momentum,
            "dampening": dampening, "nesterov": nesterov, "steps": randint(g, 2, 4) if steps is None else steps}


_SGD_MOMENTUM_LITERAL = """
def sgd(w, x, y, lr, momentum, dampening, nesterov, steps):
    w = w.clone()
    buf = None
    for _ in range(steps):
        with torch.enable_grad():
            wg = w.detach().requires_grad_()
            loss = ((x @ wg.T - y) ** 2).mean()
            g, = torch.autograd.grad(loss, wg)
        if momentum == 0:
            direction = g
        else:
            buf = g if buf is None else momentum * buf + (1 - dampening) * g
            direction = g + momentum * buf if nesterov else buf
        w = w - lr * direction
    return w
"""

SGD_MOMENTUM = FunctionFamily(
    "optim/sgd_momentum_fn", "sgd", ("w", "x", "y", "lr", "momentum", "dampening", "nesterov", "steps"),
    "`w` is a float tensor of shape (O, D), `x` of shape (N, D) and `y` of shape (N, O), all of one dtype (float32 "
    "or float64); `lr` > 0, `momentum` in [0, 1) and `dampening` in [0, 1) are Python floats, `nesterov` a bool "
    "(True only with momentum > 0 and dampening 0), and `steps` an int >= 0. Starting from a copy of `w` (the "
    "input itself is left unchanged), take `steps` steps of `torch.optim.SGD([w], lr=lr, momentum=momentum, "
    "dampening=dampening, nesterov=nesterov)`, each one on the gradient `g` of `loss = mean((x @ w.T - y) ** 2)` "
    "(the mean over all N * O elements) at the current `w`, with the gradient zeroed before each step (it does "
    "not accumulate across steps). That is: on the first step the momentum buffer is `buf = g` (no dampening "
    "on the first step), and on later steps `buf = momentum * buf + (1 - dampening) * g`; the update direction is "
    "`g + momentum * buf` with nesterov, else `buf` (with momentum 0 it is plain `g`), and `w = w - lr * "
    "direction`. Return the final `w`, of the shape and dtype of `w`; with zero steps it equals the input `w`.",
    (
        Case("typical", "take `steps` steps", lambda g: _sgd(g)),
        Case("dampening", "no dampening on the first step", lambda g: _sgd(g, dampening=pick(g, [0.3, 0.5]))),
        Case("nesterov", "with nesterov", lambda g: _sgd(g, nesterov=True)),
        Case("no momentum", "with momentum 0", lambda g: _sgd(g, momentum=0.0)),
        Case("zero steps", "with zero steps", lambda g: _sgd(g, steps=0)),
        Case("float64 input", "float32 or float64", lambda g: _sgd(g, dtype=torch.float64)),
    ),
    "def sgd(w, x, y, lr, momentum, dampening, nesterov, steps):\n"
    "    w = torch.nn.Parameter(w.clone())\n"
    "    opt = torch.optim.SGD([w], lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov)\n"
    "    for _ in range(steps):\n"
    "        opt.zero_grad()\n"
    "        ((x @ w.T - y) ** 2).mean().backward()\n"
    "        opt.step()\n"
    "    return w.detach().clone()\n",
    wrong={
        "dampened_first_step":
            "def sgd(w, x, y, lr, momentum, dampening, nesterov, steps):\n"
            "    buf = torch.zeros_like(w)\n"
            "    for _ in range(steps):\n"
            "        g = 2 * (x @ w.T - y).T @ x / y.numel()\n"
            "        buf = momentum * buf + (1 - dampening) * g\n"
            "        w = w - lr * (g + momentum * buf if nesterov else buf)\n"
            "    return w\n",
        "nesterov_ignored":
            "def sgd(w, x, y, lr, momentum, dampening, nesterov, steps):\n"
            "    w = torch.nn.Parameter(w.clone())\n"
            "    opt = torch.optim.SGD([w], lr=lr, momentum=momentum, dampening=dampening)\n"
            "    for _ in range(steps):\n"
            "        opt.zero_grad()\n"
            "        ((x @ w.T - y) ** 2).mean().backward()\n"
            "        opt.step()\n"
            "    return w.detach().clone()\n",
        "grad_not_zeroed":
            "def sgd(w, x, y, lr, momentum, dampening, nesterov, steps):\n"
            "    w = torch.nn.Parameter(w.clone())\n"
            "    opt = torch.optim.SGD([w], lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov)\n"
            "    for _ in range(steps):\n"
            "        ((x @ w.T - y) ** 2).mean().backward()\n"
            "        opt.step()\n"
            "    return w.detach().clone()\n",
    },
    also_correct={"literal": _SGD_MOMENTUM_LITERAL.lstrip()},
    hint="`torch.optim.SGD` on a `torch.nn.Parameter` copy of `w`, zeroing the gradient each step.",
)

FAMILIES = [COLUMN_STD, ARGSORT_ROWS, MASKED_SELECT, CAST_TRUNC, AVG_POOL, LOG_SOFTMAX, GRAD_ACCUMULATES,
            CROSS_ENTROPY, SMOOTH_L1, SGD_MOMENTUM]
