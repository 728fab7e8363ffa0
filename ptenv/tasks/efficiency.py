"""The efficiency level of function tasks (level 3, issue 38): the hardest level's allowlist, and
the answer graded as a graph (ptenv/inside/graph.py): traced without values in the answer's
process, run in a process without its code, its cost counted from sizes alone. The reward is the
correctness times `factor(cost / budget)`, the budget being the cost of the family's expert
implementation (`expert`) on the same shapes: full marks at or under it, falling with the ratio's
logarithm to 0 at twice it.

A family has this level when its expert implementation traces without values on every class of
hidden case: not those in UNTRACED (bench/bench_graph.py lists them; tests/test_graph.py and
build_tasks.py --verify check the list both ways).
"""

import json
import math
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ptenv.inside import graph
from ptenv.tasks.host_state import reference_run

LEVEL = 3
# Cost over budget where the efficiency reaches 0. Blind frontier-model solvers land at 1.0-1.6 times the
# best graph known (docs/difficulty.md); a band to 10 times put every one of them in its top tenth.
ZERO_AT = 2.0

UNTRACED = {
    "tensor_ops/masked_select_fn": "its output's size is the number of selected values",
    "optim/sgd_momentum_fn": "torch.optim's step records a profiler op",
    "losses/label_smoothing_ce_fn": "ignored targets are counted by value",
    "nn_modules/embedding_bag_fn": "its bags' sizes are values of `offsets`",
    "tensor_ops/scatter_reduce_fn": "its honest loop reads index values",
    "tensor_ops/fold_fn": "its honest loop reads index values",
    "losses/nll_loss_fn": "ignored targets are counted by value",
    "tensor_ops/scatter_median_fn": "its groups' sizes are values of `index`",
    "losses/cross_entropy_fn": "ignored targets are counted by value",
    "losses/ctc_loss_fn": "its lattice's sizes are values of the lengths",
    "nn_modules/group_norm_lengths_fn": "its groups' sizes are values of `lengths`",
    "nn_modules/monotonic_align_fn": "its path's sizes are values of the lengths",
    "nn_modules/max_pool2d_fn": "its graph, a slice per window offset, is over the size a trial carries",
}


def has_level(family) -> bool:
    return family.id not in UNTRACED


def factor(cost: int, budget: int) -> float:
    """1.0 at or under the budget, 1 - log2(cost / budget) above it, 0.0 from ZERO_AT times it."""
    ratio = cost / max(budget, 1)
    return 1.0 if ratio <= 1 else max(0.0, 1.0 - math.log(ratio, ZERO_AT))


def expert(family) -> str:
    """The implementation that sets the budget: the family's `efficient` one of also_correct where it
    lists one (the cheapest graph known under the meter), else its honest one."""
    return family.also_correct.get("efficient", family.by_hand)


def budgets(family, cases: list) -> list[int]:
    """The budget of each drawn case [(class, arguments, reference outputs)]."""
    return [budget(family, args) for _, args, _ in cases]


def budget(family, args: dict) -> int:
    """The cost of the family's expert implementation on these arguments: expert_run's, counted by
    expert_cost without tracing, or traced for a family of TRACED_BUDGETS. The cost depends on the
    shapes and the other arguments alone, and is cached by them."""
    key = (family.id, tuple((k, v.dtype, tuple(v.shape)) for k, v in args.items() if isinstance(v, torch.Tensor)),
           json.dumps({k: v for k, v in args.items() if not isinstance(v, torch.Tensor)}, sort_keys=True))
    with _lock:
        if key in _budgets:
            return _budgets[key]
    cost = expert_run(family, args)[1] if family.id in TRACED_BUDGETS else expert_cost(family, args)
    with _lock:
        if len(_budgets) >= MAX_CACHED:
            _budgets.clear()
        _budgets[key] = cost
    return cost


MAX_CACHED = 4096
_budgets: dict[tuple, int] = {}
_lock = threading.Lock()


# Families whose expert takes another path in Python on fake tensors than on real ones, so that
# only its traced graph gives the budget (tests/test_graph.py checks the list both ways).
TRACED_BUDGETS = {
    "optim/grad_accumulation_clip_fn": "torch.nn.Parameter detaches a fake tensor, and clip_grad_norm_ "
                                       "takes its foreach kernels on real tensors only",
}


def expert_run(family, args: dict) -> tuple[list, int]:
    """The expert implementation's graph, traced on the arguments' shapes as a trial's caller traces
    it (graph.trace_bytes), then run on them: (its outputs, its cost). GraphError if it cannot."""
    tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    with reference_run():
        text = graph.trace_bytes(_expert_function(family), {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()},
                                 {k: v for k, v in args.items() if k not in tensors})
        return graph.run(json.loads(text), {k: v.clone() for k, v in tensors.items()},
                         set(family.allowlist(LEVEL)["allow"]))


def expert_cost(family, args: dict) -> int:
    """expert_run's cost without its trace (make_fx's 1.4 ms an op call, most of a budget's CPU): the
    expert implementation called on the real arguments under a meter that counts graph.call_cost of
    each aten op as it runs. The meter sits where make_fx's tracer does, beneath autograd, so it sees
    the ops the graph records; the cost is of sizes only, and the expert (ours, tracing on every
    hidden case) takes no path by value. Equal to expert_run's for every family not in
    TRACED_BUDGETS (tests/test_graph.py)."""
    tensors = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    function = _expert_function(family)
    with reference_run(), Meter() as meter:
        function(**tensors, **{k: v for k, v in args.items() if k not in tensors})
    return meter.cost


class Meter(TorchDispatchMode):
    """The sum of graph.call_cost over the aten op calls made beneath it."""

    def __init__(self):
        super().__init__()
        self.cost = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.lift_fresh.default:  # `torch.tensor(...)`'s constant: make_fx records a copy
            func = torch.ops.aten.lift_fresh_copy.default
        out = func(*args, **kwargs)
        self.cost += graph.call_cost(func, args, kwargs, out)
        return out


def _expert_function(family):
    from ptenv.tasks.functions import compiled  # functions imports this module

    namespace = {"torch": torch, "__name__": "__main__"}
    exec(compiled(expert(family), f"{family.name} expert"), namespace)  # compiled once, not per budget
    return namespace[family.name]


def problems(family, cases: list) -> list[str]:
    """Why the expert implementation's graphs fail the efficiency level on drawn cases [(class,
    arguments, reference outputs)]: a trace, a graph over the size a trial carries, or a graph whose
    run fails a case (none: the family can have the level)."""
    from ptenv.grader import grade_outputs

    found = []
    for name, args, expected in cases:
        try:
            outputs, _ = expert_run(family, args)
        except graph.GraphError as e:
            found.append(f"{name}: {e}")
            continue
        if (verdict := grade_outputs(outputs, expected)).score != 1.0:
            found.append(f"{name}: its graph's outputs: {verdict.reason}")
    return found


def instruction(family, example: dict) -> str:
    """What the efficiency level adds to the hardest level's instruction."""
    return (f"Efficiency counts: your function is traced once per hidden input with `make_fx` on fake tensors "
            f"(shapes and dtypes, no values; the other arguments as given), and the traced aten ops are what "
            f"runs on the hidden input. So it must not read values (`.item()`, `.tolist()`, `float(t)`, `if` on a "
            f"tensor) nor make a shape that depends on values (`nonzero`, a boolean mask as an index). Its cost "
            f"is counted from sizes: each op call {graph.PER_CALL}, plus every element of its tensor arguments, "
            f"plus every element of its outputs unless it returns a view (`view`, `expand`, slicing, `select`), "
            f"plus a matrix product's multiply-adds. The graph must fit in {graph.MAX_GRAPH_BYTES // 1024} KiB of "
            f"JSON, about 1,500 op calls (a Python loop over hundreds of steps may not), and the tensor constants it "
            f"holds (a table built with `torch.tensor` at trace time, say) in {graph.MAX_CONSTANT_BYTES // 1024} KiB "
            f"together: a bigger one fails the case. The reward is correctness times efficiency: 1 at or under "
            f"the budget (the cost of an expert implementation on the same shapes), falling to 0 at "
            f"{ZERO_AT:g} times it. On the example inputs the budget is {budget(family, example)}.")
