"""Issue 24: the decisions that pick a draw (the tolerance gate, shortcut rejection, a function
family's gated hidden set) must not depend on float32 bits that differ between CPUs. Without
another CPU, the test perturbs every floating result the gates compare (families.GATE_VIEW) by up
to a quarter of the grader's tolerance, and checks which rows of the default sets change.

Today some families' decisions still flip (their float32 reference sits near the tolerance against
the float64 recompute, or an independent formulation does): they are listed in FRAGILE and the
test fails on any other family, so the list can only shrink."""

import contextlib
import hashlib
import json

import pytest
import torch

from ptenv.grader import ATOL, RTOL
from ptenv.inside import codec
from ptenv.tasks import families, functions, splits
from ptenv.tasks.families import Instance, first_gradable
from ptenv.tasks.source import load_tasks
from ptenv.tasks.tiers import FUNCTION_TIERS, select

QUARTER = 0.25
# Families whose choice of draw flips under the perturbation of seed 0 (ratio of the float64
# recompute's or the independent formulation's error to the tolerance, on an AMD EPYC).
FRAGILE = {
    "nn_modules/gru_from_weights",  # @5: independent 0.60
    "autograd/gradient_penalty_weights",  # @0: float64 0.98
    "nn_modules/gqa_rope_kv_cache",  # @5: float64 0.93; @7 draw 0: 1.49 (issue 24: differs on Intel)
    "nn_modules/batch_norm_cumulative_average",  # @0 draw 0: float64 1.02
    "nn_modules/batch_norm_training",  # @7: independent 0.83
    "nn_modules/group_norm",  # @9: float64 0.94, independent 0.87
    "nn_modules/multihead_causal_attention",  # @7 draw 0: float64 1.22 (issue 24: accepted on Intel)
    "autograd/rnn_cell_backward_fn",  # a hidden set of seed 16
}


def quarter_tolerance(seed: int):
    """A view that moves each element by a seeded random fraction in [-1/4, 1/4] of its tolerance."""
    g = torch.Generator().manual_seed(seed)

    def view(t: torch.Tensor) -> torch.Tensor:
        x = t.to(torch.float64)
        u = torch.rand(x.shape, generator=g, dtype=torch.float64) * 2 - 1
        return (x + QUARTER * u * (ATOL + RTOL * x.abs())).to(t.dtype)

    return view


@contextlib.contextmanager
def gates_see(view):
    families.GATE_VIEW = view
    try:
        yield
    finally:
        families.GATE_VIEW = None


def test_the_view_moves_values_by_at_most_a_quarter_of_the_tolerance():
    x = torch.linspace(-1e3, 1e3, 10001, dtype=torch.float64)
    moved = quarter_tolerance(0)(x)
    allowed = QUARTER * (ATOL + RTOL * x.abs())
    assert ((moved - x).abs() <= allowed).all() and (moved != x).float().mean() > 0.99


def test_every_gate_sees_its_results_through_the_hook():
    x = torch.linspace(-3.0, 3.0, 13)
    instance = Instance("nn_modules/synthetic@0", "intermediate", "nn_modules/synthetic", 0, "synthetic", {"x": x},
                        "result = torch.tanh(x)\n", "result = torch.tanh(x.double()).float()\n",
                        shortcuts={"sin": "result = torch.sin(x)\n"})
    assert first_gradable(lambda n: instance) is instance
    with gates_see(lambda t: torch.zeros_like(t)), pytest.raises(ValueError, match="accepts this shortcut"):
        first_gradable(lambda n: instance)  # every result looks the same: the shortcut passes
    with gates_see(lambda t: t + 1.0):  # each moved alike: nothing changes
        assert first_gradable(lambda n: instance) is instance
    family = functions.FunctionFamily("tensor_ops/synthetic", "f", ("x",), "tanh", (
        functions.Case("any", "tanh", lambda g: {"x": torch.randn(5, generator=g)}),),
        "def f(x):\n    return torch.tanh(x)\n", wrong={"sin": "def f(x):\n    return torch.sin(x)\n"})
    functions.gated_draw(family, "k", 2)
    with gates_see(lambda t: torch.zeros_like(t)), pytest.raises(ValueError, match="wrong implementation 'sin'"):
        functions.gated_draw(family, "k", 2)


def result_digests() -> dict[str, list[list[str]]]:
    return {name: [[row.task_id, row.digest] for row in load_tasks(**kwargs)]
            for name, kwargs in splits.set_names() if name.startswith("result/")}


@pytest.mark.slow
def test_no_draw_of_a_default_result_set_changes_under_a_quarter_tolerance_perturbation():
    plain = result_digests()
    with gates_see(quarter_tolerance(0)):
        perturbed = result_digests()
    changed = splits.differences(plain, perturbed)
    flipped = {line.split(": ")[1].split("@")[0] for line in changed}
    assert not flipped - FRAGILE, "decisions that flip:\n" + "\n".join(changed)


def hidden_set_digest(cases) -> str:
    return hashlib.sha256(json.dumps([[name, {k: codec.encode(v) if isinstance(v, torch.Tensor) else v
                                               for k, v in args.items()}] for name, args, _ in cases],
                                     sort_keys=True).encode()).hexdigest()


@pytest.mark.slow
def test_no_hidden_set_of_a_default_function_set_changes_under_a_quarter_tolerance_perturbation():
    tasks = {(i.family.id, i.seed): i.family for tier in FUNCTION_TIERS for split in ("train", "test")
             for i in select([tier], split, -1, 0, "function", 1)}

    def chosen():
        return {key: hidden_set_digest(functions.gated_draw(family, f"perturb#{key[1]}", functions.DEFAULT_HIDDEN_CASES))
                for key, family in tasks.items()}

    plain = chosen()
    with gates_see(quarter_tolerance(0)):
        perturbed = chosen()
    changed = sorted(key for key in tasks if plain[key] != perturbed[key])
    assert not {family for family, _ in changed} - FRAGILE, f"hidden sets that change: {changed}"
