"""A systematic search of every aten op overload for one that computes a function family's contract
whole (or one mode of it): what the family's allowlist (FunctionFamily.allowed less `banned`, ptenv/inside/allowlist.py)
must leave out.

Each overload's schema is bound from a hidden case: its Tensor arguments from the case's tensors
(the argument of the same name first, then every plausible assignment, bounded), out= arguments to
fresh tensors, the others from the case's non-tensor values, their defaults and small candidate
sets (dims, bools, reduction/mode enums as ints 0..3). A binding names where each argument comes
from (a parameter of the family, a constant, a fresh out tensor), so the same binding applies to
every case. It computes a mode whole when one item of its output (or of its out tensors) passes
`grade_outputs` against each reference output, as it is or as a view (its elements in the
reference's shape by any order of its dims), on every case of that mode drawn (at least
MIN_CASES, of different classes when the mode has them). A family's modes are the values of its
string and bool parameters (a binding may fix an enum as a constant), so "sum" and "range" of a
scatter are searched apart.

Some ops crash the process or hang on inputs they were not meant for, so the search runs in a
child process, which keeps where it is (op, mode, binding) in a shared file; the parent restarts it
after the binding it died or hung on (SKIP lists ops known to crash on most bindings, to save the
restarts). With `--allowlist` the child first installs the family's hardest-level allowlist, as the
caller does: then nothing must be found (tests/test_allowlist.py).

Run it: .venv/bin/python -m tests.support.op_search advanced/tensor_ops/scatter_reduce_fn
(or a function name: scatter_reduce; or `all` for every family).
"""

import itertools
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

MIN_CASES = 3
MAX_BINDINGS = 512  # per overload and mode
HANG = 30.0  # seconds one op may run before the parent gives up on it
CRASHES = 4  # bindings of one op that may kill the child before the parent skips the rest of the op
PROGRESS = struct.Struct("qqq")  # where the child is: op, mode, binding
# Ops that kill or wedge the process on the inputs a search gives them (found by running the search;
# the restart logic would get past them too, at the cost of a new child each time).
SKIP = {
    "aten::_nested_tensor_from_mask_left_aligned", "aten::_nested_view_from_buffer",
    "aten::_nested_view_from_jagged", "aten::_nested_get_values", "aten::_fused_sdp_choice",
    "aten::_cholesky_solve_helper", "aten::_cholesky_solve_helper.out", "aten::_convert_indices_from_coo_to_csr",
    "aten::_cummax_helper", "aten::_cummin_helper", "aten::_dyn_quant_matmul_4bit",
    "aten::_log_softmax_backward_data", "aten::_log_softmax_backward_data.out", "aten::_reshape_alias_copy",
    "aten::_reshape_alias_copy.out", "aten::_slow_conv2d_backward.grad_input", "aten::_weight_norm",
    "aten::_weight_norm_interface", "aten::_weight_norm_interface.out", "aten::choose_qparams_optimized",
    "aten::fractional_max_pool2d_backward", "aten::fractional_max_pool2d_backward.grad_input",
    "aten::fractional_max_pool3d_backward", "aten::fractional_max_pool3d_backward.grad_input",
    "aten::mkldnn_rnn_layer_backward", "aten::mkldnn_rnn_layer_backward.out",
    "aten::reflection_pad1d_backward", "aten::reflection_pad1d_backward.grad_input",
    "aten::reflection_pad2d_backward", "aten::reflection_pad2d_backward.grad_input",
    "aten::_convert_indices_from_csr_to_coo", "aten::_pad_packed_sequence", "aten::_remove_batch_dim",
    "aten::embedding_backward", "aten::embedding_dense_backward.out", "aten::promote_types",
    # batch norm forwards write running statistics of the wrong size out of bounds; no family here
    # is a batch norm forward (batch_norm_backward's outputs are gradients, which they do not give)
    "aten::_batch_norm_no_update", "aten::_batch_norm_no_update.out", "aten::native_batch_norm",
    "aten::native_batch_norm.out", "aten::_native_batch_norm_legit.no_stats",
    "aten::_native_batch_norm_legit.no_stats_out",
    # crashes on nearly every binding; batch_norm_backward bans it by name (it dispatches to the
    # batch norm backward kernels the search does find)
    "aten::_batch_norm_impl_index_backward",
    # maps (with shared=True, creates) a file named by a string argument: a mode's name, in the cwd
    "aten::from_file", "aten::from_file.out",
}
# Ops that are pure allocation or randomness, or touch process state: nothing they return is a contract.
SKIP_PREFIXES = ("aten::_cufft", "aten::_cudnn", "aten::cudnn", "aten::miopen", "aten::_test_", "aten::_print",
                 "aten::_set_", "aten::sym_", "aten::_assert", "aten::_functional_assert", "aten::record_stream",
                 "aten::_foobar", "aten::_async_error", "aten::_make_dep_token", "aten::_sparse_mm_reduce")
DIMS = (-1, 0, 1, 2)
ENUMS = (0, 1, 2, 3)
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool)
STATE_ARGS = {"layout", "device", "pin_memory", "generator", "memory_format", "non_blocking", "copy"}


@dataclass(frozen=True)
class Found:
    mode: str  # the mode's parameter values, "" when the family has none
    op: str  # aten::packet.overload
    binding: str  # argument=source, for a reader
    views: list  # which items of the op's outputs give each reference output

    def packet(self) -> str:
        return self.op.removeprefix("aten::").split(".")[0]


# --- one overload's bindings ---------------------------------------------------------------------


def kind_of(t) -> str:
    return str(t)


def tensor_candidates(arg, tensors: dict, optional: bool) -> list:
    """The case's tensors, the one of the argument's name first; a parameter that is None in this
    case only for an optional argument ("opt": None may reach it, which a required one must never see)."""
    how = "opt" if optional else "tensor"
    names = [arg.name] if arg.name in tensors else []
    names += [k for k in tensors if k != arg.name]
    return [(how, k) for k in names if optional or tensors[k] is not None]


def scalar_pool(case: dict, want) -> list:
    """The case's non-tensor values accepted where a schema wants `want` (a predicate)."""
    return [("param", k) for k, v in case.items() if not isinstance(v, torch.Tensor) and want(v)]


def is_int(v) -> bool:
    return type(v) is int


def is_number(v) -> bool:
    return type(v) in (int, float)


def is_int_list(v) -> bool:
    return type(v) in (list, tuple) and all(type(i) is int for i in v)


def consts(*values) -> list:
    return [("const", v) for v in values]


def value_candidates(arg, case: dict) -> list | None:
    """The candidate sources of a non-tensor argument, the likeliest first; None if it cannot be bound."""
    t = kind_of(arg.type)
    optional = t.startswith("Optional[")
    base = t.removeprefix("Optional[").removesuffix("]") if optional else t
    default = [("default", None)] if arg.has_default_value() else []
    none = consts(None) if optional else []
    if arg.name in STATE_ARGS:
        return default or none or None
    if arg.name == "dtype" or arg.name.endswith("_dtype"):
        return default + none + consts(*DTYPES)
    named = [("param", arg.name)] if arg.name in case and not isinstance(case[arg.name], torch.Tensor) else []
    if named and base == "List[int]" and is_int(case[arg.name]):
        named = [("list", arg.name), ("pair", arg.name)]  # an int where the op takes [int] or [int, int]
    if base == "int":
        pool = scalar_pool(case, is_int) + consts(*DIMS) + (consts(*ENUMS[2:]) if "mode" in arg.name
                                                           or "reduc" in arg.name else [])
    elif base in ("float", "number"):
        pool = scalar_pool(case, is_number) + consts(0.0, 1.0, -1.0)
    elif base == "bool":
        pool = scalar_pool(case, lambda v: type(v) is bool) + consts(False, True)
    elif base == "str":
        pool = scalar_pool(case, lambda v: type(v) is str)
    elif base == "List[int]":
        ints = [k for _, k in scalar_pool(case, is_int)]
        pool = scalar_pool(case, is_int_list) + [("list", k) for k in ints] + [("pair", k) for k in ints] \
            + consts([-1], [0], [1], [])
    elif base == "List[bool]":
        pool = consts([True, True, True], [True, False, False])  # a backward's output_mask
    elif base in ("List[float]", "List[number]"):
        pool = []
    else:
        return default or none or None
    fits = {"int": is_int, "List[int]": is_int_list, "float": is_number, "number": is_number, "str": lambda v: type(v) is str}
    if named and base in fits and fits[base](case[arg.name]):
        pool = named  # the family's parameter of that name, of the type wanted: the plausible assignment
    seen, out = set(), []
    for c in named + default + none + pool:
        key = repr(c)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out or None


def bindings(schema, case: dict):
    """Every binding of the schema (bounded): [(argument name, source)] per binding, the likeliest
    first (by the sum of the candidates' ranks, so that no argument is stuck at its first choice)."""
    # A parameter that is None here may be a tensor in another case of the mode (an optional weight).
    tensors = {k: v for k, v in case.items() if isinstance(v, torch.Tensor) or v is None}
    names, candidates, outs = [], [], []
    for arg in schema.arguments:
        t = kind_of(arg.type)
        if arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write and "Tensor" in t:
            if t != "Tensor":
                return
            outs.append(arg.name)
            continue
        if t in ("Tensor", "Optional[Tensor]"):
            optional = t.startswith("Optional")
            cands = tensor_candidates(arg, tensors, optional)
            if optional:  # None is likelier than a tensor of another name
                cands = cands[:1] + consts(None) + cands[1:] if arg.name in tensors else consts(None) + cands
        elif t in ("List[Tensor]", "List[Optional[Tensor]]"):
            cands = [("tlist", k) for k in tensors if tensors[k] is not None]
        else:
            cands = value_candidates(arg, case)
        if not cands:
            return
        names.append(arg.name)
        candidates.append(cands)
    count = 0
    for tried, ranks in enumerate(ranked([len(c) for c in candidates])):
        if count >= MAX_BINDINGS or tried >= 20 * MAX_BINDINGS:
            return
        choice = [c[i] for c, i in zip(candidates, ranks)]
        used = [what for how, what in choice if how in ("tensor", "opt", "tlist")]
        if len(used) != len(set(used)):
            continue  # each case tensor binds one argument at most
        count += 1
        yield list(zip(names, choice)) + [(n, ("out", i)) for i, n in enumerate(outs)]


def ranked(sizes: list[int]):
    """Index tuples into lists of these sizes, by increasing sum of indices."""
    for total in range(sum(n - 1 for n in sizes) + 1):
        yield from with_sum(sizes, total)


def with_sum(sizes: list[int], total: int):
    if not sizes:
        if total == 0:
            yield ()
        return
    rest = sum(n - 1 for n in sizes[1:])
    for i in range(max(0, total - rest), min(sizes[0] - 1, total) + 1):
        for tail in with_sum(sizes[1:], total - i):
            yield (i,) + tail


def materialize(binding, case: dict, out_dtypes: list) -> dict:
    kwargs = {}
    for name, (how, what) in binding:
        if how == "default":
            continue
        if how == "const":
            kwargs[name] = what
        elif how in ("param", "tensor", "opt"):
            v = case[what]
            if v is None and how == "tensor":
                raise ValueError(f"{what} is None here")  # never None into a required Tensor
            kwargs[name] = v.clone() if isinstance(v, torch.Tensor) else v
        elif how == "tlist":
            kwargs[name] = [case[what].clone()]
        elif how == "pair":
            kwargs[name] = [case[what], case[what]]
        elif how == "list":
            kwargs[name] = [case[what]]
        elif how == "out":
            kwargs[name] = torch.empty(0, dtype=out_dtypes[min(what, len(out_dtypes) - 1)])
    return kwargs


def items(result, kwargs: dict, binding) -> list:
    """The op's outputs as a flat list: its return value's tensors, then its out tensors."""
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    values += [kwargs[name] for name, (how, _) in binding if how == "out"]
    return [v if isinstance(v, torch.Tensor) else None for v in values]


def as_views(o: torch.Tensor, e: torch.Tensor) -> list:
    """o, then o's elements in e's shape by every order of o's dims (when they are as many)."""
    if o.numel() != e.numel() or o.dim() > 6:
        return [o]
    return [o] + [o.permute(order).reshape(e.shape) for order in itertools.permutations(range(o.dim()))]


def views_that_pass(outputs: list, expected: list) -> list[set]:
    """For each reference output, the indices of the op's outputs that pass it, as they are or as a view."""
    from ptenv.grader import grade_outputs
    found = []
    for e in expected:
        ok = set()
        for i, o in enumerate(outputs):
            try:
                if o is not None and o.layout == torch.strided and o.device.type == "cpu" \
                        and any(grade_outputs([v], [e]).score == 1.0 for v in as_views(o, e)):
                    ok.add(i)
            except Exception:
                pass
        found.append(ok)
    return found


def run(op, binding, case: dict, expected: list) -> list[set] | None:
    try:
        kwargs = materialize(binding, case, [e.dtype for e in expected])
        result = op(**kwargs)
    except Exception:
        return None
    return views_that_pass(items(result, kwargs, binding), expected)


def computes(op, binding, cases: list) -> list[set] | None:
    """The output views that pass every case (args, expected), or None."""
    views = None
    for args, expected in cases:
        found = run(op, binding, args, expected)
        if found is None:
            return None
        views = found if views is None else [a & b for a, b in zip(views, found)]
        if not all(views):
            return None
    return views


# --- a family's modes and cases ------------------------------------------------------------------


def family_by_name(name: str):
    from ptenv.tasks.tiers import FUNCTION_TIERS
    for family in (f for members in FUNCTION_TIERS.values() for f in members):
        if name in (family.id, family.name, family.id.split("/")[-1]):
            return family
    raise KeyError(name)


# The parameters whose values split a family into modes searched apart: its string parameters,
# unless listed here (a bool that no aten op takes, like a reverse scan, splits too).
MODE_PARAMS = {"cumulative": ("op", "reverse", "exclusive")}


def statistics(args: dict, dims: list) -> dict:
    """The mean and 1/std a normalisation's backward kernel takes: a solver computes them first."""
    x = args["x"]
    mean = x.mean(dims, keepdim=True)
    rstd = 1 / torch.sqrt(((x - mean) ** 2).mean(dims, keepdim=True) + args["eps"])
    return {"mean": mean, "rstd": rstd, "save_mean": mean.flatten(), "save_invstd": rstd.flatten()}


# Tensors a solver derives before the one call that would finish the job, offered to the search
# beside the case's own: a backward kernel takes the forward's saved statistics.
EXTRAS = {
    "layer_norm_backward": lambda a: {**statistics(a, [-1]), "normalized_shape": list(a["x"].shape[-1:])},
    "batch_norm_backward": lambda a: statistics(a, [0] + list(range(2, a["x"].dim()))),
}


def mode_of(family, args: dict) -> str:
    keys = MODE_PARAMS.get(family.name) or [k for k, v in args.items() if type(v) is str]
    return ",".join(f"{k}={args[k]}" for k in sorted(keys))


def modes(family, rounds: int = 12) -> dict[str, list]:
    """Hidden cases grouped by mode: {mode: [(class, args, expected)]}, MIN_CASES of each mode, of
    different classes where the mode has them (drawn until every mode seen has MIN_CASES)."""
    from ptenv.tasks.functions import as_outputs, call
    groups: dict[str, list] = {}
    n = len(family.cases)
    for r in range(rounds):
        for k, (name, args) in enumerate(family.draw(f"op-search#{r}", n)):
            expected = as_outputs(call(family.reference, family.name, args))
            args = {**args, **EXTRAS[family.name](args)} if family.name in EXTRAS else args
            groups.setdefault(mode_of(family, args), []).append((name, args, expected))
        if r >= 1 and all(len(cases) >= MIN_CASES for cases in groups.values()):
            break
    return {m: pick(cases) for m, cases in groups.items() if len(cases) >= MIN_CASES}


def pick(cases: list) -> list:
    """MIN_CASES cases, the distinct classes first."""
    first, rest, seen = [], [], set()
    for c in cases:
        (rest if c[0] in seen else first).append(c)
        seen.add(c[0])
    return (first + rest)[:MIN_CASES]


def describe(binding) -> str:
    return ", ".join(f"{n}={what!r}" if how in ("const",) else f"{n}={how}:{what}" if how not in ("param", "tensor", "opt") else f"{n}={what}"
                     for n, (how, what) in binding if how != "default")


# --- the child: try every overload -----------------------------------------------------------------


def overload_names() -> list[str]:
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::"))


def resolve(name: str):
    packet, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def search_child(family_id: str, resume: tuple[int, int, int], under_allowlist: bool, progress: str) -> None:
    """Try every overload from `resume` (op, mode, binding: past that binding), writing where it
    is to the `progress` file (plain stores into a mapping: no system call per binding)."""
    from ptenv.tasks.tiers import find_family
    family = find_family(family_id)[1]
    groups = modes(family)  # drawn before the allowlist: the references may use ops off it
    torch.set_num_threads(1)
    if under_allowlist:
        from ptenv.inside import allowlist
        allowlist.install(set(family.allowlist(2)["allow"]))
    names = overload_names()
    with open(progress, "r+b") as f:
        where = mmap.mmap(f.fileno(), PROGRESS.size)
    for i in range(resume[0], len(names)):
        name = names[i]
        print(json.dumps({"at": i, "op": name}), flush=True)
        PROGRESS.pack_into(where, 0, i, 0, -1)
        if name in SKIP or name.startswith(SKIP_PREFIXES):
            continue
        try:
            op = resolve(name)
        except Exception:
            continue
        for k, (mode, cases) in enumerate(groups.items()):
            if (i, k) < resume[:2]:
                continue
            past = resume[2] if (i, k) == resume[:2] else -1
            for found in search_op(op, cases, past, lambda j: PROGRESS.pack_into(where, 0, i, k, j)):
                print(json.dumps({"found": [mode, name, *found]}), flush=True)
    print(json.dumps({"done": len(names)}), flush=True)


def search_op(op, cases: list, past: int = -1, mark=lambda j: None):
    """(binding, views) of the first binding of `op` after the `past`-th that computes every case
    of the mode; `mark(j)` before trying the j-th."""
    for j, binding in enumerate(bindings(op._schema, cases[0][1])):
        if j <= past:
            continue
        mark(j)
        views = computes(op, binding, [(a, e) for _, a, e in cases])
        if views is not None:
            yield describe(binding), [sorted(v) for v in views]
            return  # one binding is enough to name the op


# --- the parent: run the child, past crashes and hangs ---------------------------------------------


def search(family_id: str, allowlist: bool = False, timeout: float = 1800.0, log=None) -> tuple[list[Found], list[str]]:
    """(what computes a mode of the family whole, the bindings the child died or hung on)."""
    found, lost, resume, deadline = [], [], (0, 0, -1), time.monotonic() + timeout
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.NamedTemporaryFile() as progress:
        progress.write(bytes(PROGRESS.size))
        progress.flush()
        while True:
            cmd = [sys.executable, "-m", "tests.support.op_search", "--child", family_id, progress.name,
                   *map(str, resume)] + (["--allowlist"] if allowlist else [])
            child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=root,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
            op, done = None, False
            for line in lines_until(child, deadline):
                doc = json.loads(line)
                if "at" in doc:
                    op = doc["op"]
                elif "found" in doc:
                    mode, name, binding, views = doc["found"]
                    found.append(Found(mode, name, binding, views))
                    if log:
                        log(f"{mode or '(one mode)'}: {name}({binding}) views {views}")
                elif "done" in doc:
                    done = True
            if child.poll() is None:
                child.kill()
            child.wait()
            if done:
                return found, lost
            if time.monotonic() > deadline:
                raise TimeoutError(f"{family_id}: the search ran past {timeout} s (at {op})")
            progress.seek(0)
            at = PROGRESS.unpack(progress.read(PROGRESS.size))
            lost.append(f"{op} (mode {at[1]}, binding {at[2]})")
            # died again where it last resumed, before any binding (the op itself kills it), or on
            # CRASHES of its bindings: the rest of the op is lost, and said so
            if at == resume or sum(line.startswith(f"{op} ") for line in lost) >= CRASHES:
                at = (at[0] + 1, 0, -1)
                lost.append(f"{op}: the rest of it")
            resume = at
            if log:
                log(f"lost {lost[-1]}: the child died or hung there")


def lines_until(child, deadline: float):
    """The child's lines; stops when it exits, or goes HANG seconds without a line."""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ)
    while True:
        if not sel.select(timeout=min(HANG, max(0.1, deadline - time.monotonic()))):
            return
        line = child.stdout.readline()
        if not line:
            return
        yield line


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        search_child(argv[1], tuple(map(int, argv[3:6])), "--allowlist" in argv, argv[2])
        return
    under_allowlist = "--allowlist" in argv
    names = [a for a in argv if not a.startswith("--")]
    if names == ["all"]:
        from ptenv.tasks.tiers import FUNCTION_TIERS
        names = [f.id for members in FUNCTION_TIERS.values() for f in members]
    for name in names:
        family = family_by_name(name)
        print(f"== {family.id}{' (under its allowlist)' if under_allowlist else ''}", flush=True)
        t0 = time.monotonic()
        found, lost = search(family.id, under_allowlist, log=lambda s: print("  " + s, flush=True))
        packets = sorted({f.packet() for f in found})
        print(f"  packets: {packets}\n  lost: {lost}\n  {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
