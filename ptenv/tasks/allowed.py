"""The operations a function task's hardest level allows (ptenv/inside/allowlist.py removes every
other): groups of aten ops (overload packets, each with every overload and its in-place and out= forms),
each named for the instruction the way a model writes it.

Every family gets BASE; some get more groups, and a family's `banned` takes out what would compute
its contract whole (tests/test_allowlist.py searches every op that stays). torch functions that are
CompositeImplicitAutograd (`torch.matmul`, `F.pad`, `Tensor.reshape`, ...) are not listed: they run
as the ops they are made of, each of which must be allowed.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    says: str  # how the instruction names it: torch functions, methods and operators
    ops: tuple[str, ...]  # aten overload packets, without the namespace


ARITHMETIC = Group(
    "arithmetic and elementwise math (`+ - * / // % **`, `abs`, `neg`, `sign`, `sqrt`, `rsqrt`, `exp`, `log`, "
    "`log1p`, `expm1`, `sin`, `cos`, `tanh`, `sigmoid`, `floor`, `ceil`, `round`, `trunc`, `frac`, `clamp`, "
    "`minimum`, `maximum`, `fmod`, `remainder`, `torch.div(..., rounding_mode=...)`, `reciprocal`, `nan_to_num`, "
    "`& | ^ ~`, `logical_and`, `logical_or`, `logical_not`, `logical_xor`, `exp2`, `log2`, `log10`, `tan`, `asin`, "
    "`acos`, `atan`, `atan2`, `sinh`, `cosh`, `erf`, `erfc`, `fmin`, `fmax`, `square`, `hypot`, `copysign`, `relu`, "
    "`signbit`, and the fused `addcmul`, `addcdiv`, `lerp`)",
    ("add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "abs", "neg",
     "sign", "sgn", "signbit", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
     "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "sigmoid", "erf", "erfc", "floor", "ceil",
     "round", "trunc", "frac", "clamp", "clamp_min", "clamp_max", "clip", "minimum", "maximum", "fmin", "fmax",
     "reciprocal", "nan_to_num", "square", "addcmul", "addcdiv", "lerp", "hypot", "copysign", "relu",
     "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor",
     "logical_not", "_foreach_mul", "_foreach_add", "_foreach_div"))
COMPARISON = Group(
    "comparisons (`== != < <= > >=`, `isnan`, `isinf`, `isposinf`, `isneginf`, `isfinite`, `torch.where`, "
    "`masked_fill`, `torch.equal`)",
    ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isposinf", "isneginf", "where", "masked_fill",
     "equal", "is_nonzero"))
VIEWS = Group(
    "views and reshapes (`view`, `reshape`, `flatten`, `permute`, `transpose`, `.T`, `squeeze`, `unsqueeze`, "
    "`expand`, `narrow`, slicing `x[a:b:s]`, `select`, `unbind`, `split`, `chunk`, `flip`, `roll`, `repeat`, `movedim`, "
    "`diagonal`, `as_strided` (any sizes and strides over the tensor's own elements), `detach`, constant padding "
    "`F.pad(x, p, value=c)` with any constant c)",
    ("as_strided", "view", "_unsafe_view", "_reshape_alias", "alias", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand",
     "slice", "select", "narrow", "split", "split_with_sizes", "unbind", "chunk", "diagonal", "flip", "detach",
     "lift_fresh", "view_as_real", "view_as_complex", "unsafe_split", "unsafe_split_with_sizes", "_unsafe_index",
     "constant_pad_nd", "repeat", "roll"))
CREATION = Group(
    "creation and copies (`torch.tensor`, `zeros`, `ones`, `full`, `empty`, `arange`, `linspace`, the `*_like` and "
    "`new_*` forms, `eye`, `tril`, `triu`, `clone`, `contiguous`, `.to(dtype)`, `.float()`, `.long()`, `copy_`, "
    "`fill_`, `zero_`, `item`)",
    ("empty", "empty_strided", "empty_like", "empty_permuted", "zeros", "zeros_like", "ones", "ones_like", "full",
     "full_like", "scalar_tensor", "arange", "linspace", "eye", "new_empty", "new_empty_strided", "new_zeros",
     "new_ones", "new_full", "clone", "copy", "_to_copy", "_copy_from", "_copy_from_and_resize",
     "fill", "zero", "resize", "_local_scalar_dense", "lift", "lift_fresh_copy", "resize_as",
     "tril", "triu", "_assert_async", "_assert_scalar", "_functional_assert_async", "_assert_tensor_metadata"))
JOINING = Group("joining (`torch.cat`, `torch.stack`)", ("cat", "stack", "_stack"))
INDEXING = Group(
    "indexing and gathering (`x[i]` with ints, slices or integer tensors, `x[i] = v`, `gather`, `index_select`, "
    "`take`, `repeat_interleave`, `F.embedding`)", ("index", "index_put", "_index_put_impl", "gather", "index_select",
               "take", "embedding", "repeat_interleave"))
REDUCTIONS = Group(
    "plain reductions (`sum`, `mean`, `prod`, `amax`, `amin`, `max`/`min` over a dim, `argmax`, `argmin`, `any`, "
    "`all`, `norm`, `count_nonzero`)", ("sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all",
                      "linalg_vector_norm", "norm", "_foreach_norm", "count_nonzero", "_is_all_true", "_is_any_true"))
MATMUL = Group("matrix products (`@`, `torch.matmul`, `mm`, `bmm`, `mv`, `dot`, `vdot`, and the fused `addmm`, "
               "`addmv`, `addbmm`, `baddbmm`)",
               ("mm", "bmm", "mv", "dot", "vdot", "addmm", "addmv", "addbmm", "baddbmm"))
SORT = Group("sorting (`torch.sort`, `argsort`)", ("sort", "argsort"))
SOFTMAX = Group("`torch.softmax` and `torch.log_softmax`", ("_softmax", "_log_softmax", "_safe_softmax"))
SCATTER = Group("scatter (`scatter`, `index_add`)", ("scatter", "scatter_add", "index_add"))
MASK = Group("boolean masks as indices (`x[mask]`, `nonzero`, `masked_select`)", ("nonzero", "masked_select"))

BASE = (ARITHMETIC, COMPARISON, VIEWS, CREATION, JOINING, INDEXING, MASK, REDUCTIONS, MATMUL)
LOGSUMEXP = Group("`torch.logsumexp`", ("logsumexp",))
