"""The efficiency level's meter (ptenv/inside/graph.py, issue 38): a function traced without values
into a graph of aten ops, the graph run on real inputs under the allowlist, its cost counted from
sizes alone. Deterministic across runs and CPU capabilities; every hostile class ends in a failure
that names it, a wrong answer, or a cost at least that of honest work. Real torch, in this process
and in fresh ones."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ptenv.inside import graph
from ptenv.inside.graph import GraphError, PER_CALL
from ptenv.inside.namespace import new_namespace
from ptenv.tasks import efficiency
from ptenv.tasks.fn_intermediate import TRIMMED_MEAN
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.tiers import FUNCTION_TIERS, find_family

REPO = Path(__file__).resolve().parents[1]
ALLOWED = set(TRIMMED_MEAN.allowlist(2)["allow"])
CASES = HiddenCases("graph-test-secret", 8).of(TRIMMED_MEAN, 0)


def define(source: str, name: str = "trimmed_mean"):
    namespace = new_namespace({})
    exec(compile(textwrap.dedent(source), "<answer>", "exec"), namespace)
    return namespace[name]


def spec(args: dict) -> tuple[dict, dict]:
    tensors = {k: (v.dtype, tuple(v.shape)) for k, v in args.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in args.items() if not isinstance(v, torch.Tensor)}


def traced(source: str, args: dict) -> dict:
    """The graph as it crosses the boundary: JSON text, decoded."""
    return json.loads(json.dumps(graph.trace(define(source), *spec(args))))


def run(source: str, args: dict) -> tuple[list, int]:
    return graph.run(traced(source, args), {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}, ALLOWED)


def test_the_reference_traced_and_run_passes_every_case_at_a_cost_counted_from_sizes():
    for _, args, expected in CASES:
        outputs, cost = run(TRIMMED_MEAN.reference, args)
        assert len(outputs) == 1 and torch.allclose(outputs[0], expected[0], rtol=1e-5, atol=1e-6)
        n, c, k = *args["x"].shape, args["k"]
        sort = PER_CALL + n * c + 2 * n * c  # reads x, writes values and indices
        view = PER_CALL + n * c  # the slice reads its argument and moves nothing
        mean = PER_CALL + (n - 2 * k) * c + c
        assert cost == sort + view + mean, (args["x"].shape, k)


def test_the_cost_is_the_same_on_every_run_and_every_cpu_capability():
    _, args, _ = CASES[0]
    costs = {run(TRIMMED_MEAN.reference, args)[1] for _ in range(5)}
    script = textwrap.dedent("""
        import json, torch
        from tests.test_graph import CASES, TRIMMED_MEAN, run
        print(json.dumps([torch.backends.cpu.get_cpu_capability(), [run(TRIMMED_MEAN.reference, a)[1] for _, a, _ in CASES]]))
    """)
    seen = {}
    for capability in ("default", "avx2"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        reported, costs_there = json.loads(done.stdout.splitlines()[-1])
        seen[reported] = costs_there
    assert set(seen) == {"DEFAULT", "AVX2"}  # each process ran the kernels of its capability
    assert seen["DEFAULT"] == seen["AVX2"] == [run(TRIMMED_MEAN.reference, a)[1] for _, a, _ in CASES]
    assert len(costs) == 1


# Each reads values, which the trace does not have: it fails, saying so.
READS_VALUES = {
    "python_floats_from_tolist": """
        def trimmed_mean(x, k):
            columns = x.t().tolist()
            return torch.tensor([sum(sorted(c)[k:len(c) - k]) / (len(c) - 2 * k) for c in columns], dtype=x.dtype)
        """,
    "values_one_by_one": """
        def trimmed_mean(x, k):
            out = torch.empty(x.shape[1], dtype=x.dtype)
            for c in range(x.shape[1]):
                column = sorted(float(x[i, c]) for i in range(x.shape[0]))
                out[c] = sum(column[k:len(column) - k]) / (len(column) - 2 * k)
            return out
        """,
    "branch_on_a_value": """
        def trimmed_mean(x, k):
            if x.max() > 0:
                return x.sort(dim=0).values[k:x.shape[0] - k].mean(dim=0)
            return x.mean(0)
        """,
}


@pytest.mark.parametrize("name", sorted(READS_VALUES))
def test_an_answer_that_reads_values_fails_to_trace_naming_it(name):
    _, args, _ = CASES[0]
    with pytest.raises(GraphError, match="could not be traced without values"):
        traced(READS_VALUES[name], args)


def test_work_in_a_thread_or_a_cache_leaves_nothing_in_the_graph():
    """A thread's ops are not the trace's, and a result kept from an earlier call is not this call's:
    either way the graph would hold a tensor made elsewhere, and the trace fails, naming it."""
    threaded = """
        import threading
        def trimmed_mean(x, k):
            box = []
            t = threading.Thread(target=lambda: box.append(x.sort(dim=0).values[k:x.shape[0] - k].mean(dim=0)))
            t.start(); t.join()
            return box[0]
        """
    cached = """
        CACHE = {}
        def trimmed_mean(x, k):
            if "last" not in CACHE:
                CACHE["last"] = x.sort(dim=0).values[k:x.shape[0] - k].mean(dim=0)
            return CACHE["last"]
        """
    _, args, _ = CASES[0]
    with pytest.raises(GraphError, match="not a tensor made in this call"):
        traced(threaded, args)
    function = define(cached)
    graph.trace(function, *spec(args))  # the first call fills the cache
    with pytest.raises(GraphError, match="not a tensor made in this call"):
        graph.trace(function, *spec(args))


def test_views_that_hide_copies_cost_what_they_read():
    """An expanded view is free to make, and every op on it pays for all its elements."""
    _, args, _ = CASES[0]
    honest = run(TRIMMED_MEAN.reference, args)[1]
    expanded = """
        def trimmed_mean(x, k):
            big = x.unsqueeze(0).expand(64, *x.shape)
            return big.sort(dim=1).values[0, k:x.shape[0] - k].mean(dim=0)
        """
    outputs, cost = run(expanded, args)
    n, c = args["x"].shape
    assert cost >= honest + 3 * 63 * n * c  # the sort read and wrote 64 copies


def test_as_strided_lays_out_its_own_elements_and_reaches_no_other():
    """Windows that overlap, over a slice, run and pay for what they read; a one-element view laid
    over its whole storage (a read of one, for the lot) fails the case, naming it."""
    _, args, _ = CASES[0]
    windows = """
        def trimmed_mean(x, k):
            rows = x[1:]
            return rows.as_strided((rows.shape[0] - 1, 2, rows.shape[1]), (rows.shape[1], rows.shape[1], 1)).sum(1)
        """
    outputs, _ = run(windows, args)
    assert torch.equal(outputs[0], args["x"][1:-1] + args["x"][2:])
    whole = "def trimmed_mean(x, k):\n    return x[:1, :1].as_strided(x.shape, x.stride()).sum(0)\n"
    with pytest.raises(GraphError, match="as_strided.*outside its tensor"):
        run(whole, args)


def test_element_by_element_ops_cost_more_than_one_op_on_all():
    _, args, _ = CASES[0]
    n, c = args["x"].shape
    whole = run("def trimmed_mean(x, k):\n    return x * 2\n", args)[1]
    each = run("def trimmed_mean(x, k):\n    return torch.stack([x[i] * 2 for i in range(x.shape[0])])\n", args)[1]
    assert whole == PER_CALL + n * c + n * c
    assert each > whole + n * PER_CALL


def test_a_hostile_graph_fails_naming_what_is_wrong():
    x = torch.ones(4, 2)
    good = traced(TRIMMED_MEAN.reference, {"x": x, "k": 1})
    removed = json.loads(json.dumps(good).replace("aten::sort", "aten::median"))
    bad = {
        "an op off the allowlist": (removed, "not on this task's allowlist"),
        "a reference out of range": ({**good, "outputs": [{"ref": 99}]}, "out of range"),
        "another format": ({**good, "format": 0}, "not a graph of this format"),
        "missing inputs": ({**good, "inputs": ["y"]}, "inputs or nodes are malformed"),
        "not an op": ({**good, "nodes": [{"op": "aten::no_such_op", "args": [], "kwargs": {}}]}, "no_such_op"),
        "another device": ({**good, "nodes": [{"op": "aten::empty.memory_format", "args": [[2]],
                                               "kwargs": {"device": {"device": "cuda"}}}]}, "only the CPU"),
        "a malformed argument": ({**good, "nodes": [{"op": "aten::add.Tensor", "args": [{"ref": 0}, {"x": 1}],
                                                     "kwargs": {}}]}, "malformed"),
    }
    for name, (hostile, why) in bad.items():
        with pytest.raises(GraphError, match=why):
            graph.run(hostile, {"x": x}, {"aten::" + op for op in ("sort", "slice", "mean", "add", "empty")})
    with pytest.raises(GraphError, match="constants are over"):
        graph.trace(define(f"TABLE = torch.ones({graph.MAX_CONSTANT_BYTES // 4 + 1})\n"
                           "def trimmed_mean(x, k):\n    return x.sum(0) + TABLE[:1]\n"), *spec({"x": x, "k": 1}))


@pytest.mark.parametrize("family_id", sorted(efficiency.UNTRACED))
def test_a_family_without_the_efficiency_level_has_an_honest_implementation_that_fails_it(family_id):
    """efficiency.UNTRACED holds no family that could have the level (build_tasks.py --verify checks
    the other way: every other family's honest graphs pass its hidden cases)."""
    family = find_family(family_id)[1]
    assert efficiency.LEVEL not in family.levels
    draws = (HiddenCases("graph-test-secret", 8).of(family, seed) for seed in range(8))  # one that shows it
    assert any(efficiency.problems(family, cases) for cases in draws)


LEVEL_3 = sorted(f.id for tier in FUNCTION_TIERS.values() for f in tier if efficiency.LEVEL in f.levels)


@pytest.mark.parametrize("family_id", LEVEL_3)
def test_a_budget_is_the_cost_of_the_experts_graph_on_every_class_of_case(family_id):
    """efficiency.budget counts the expert's cost without tracing it (expert_cost), but for the
    families of TRACED_BUDGETS, where that count is not the graph's on some case: the list is
    checked both ways. Two cases of each class, their shapes drawn afresh."""
    family = find_family(family_id)[1]
    assert efficiency.has_level(family)
    cases = family.draw("budget-test", 2 * len(family.cases))
    traced = [efficiency.expert_run(family, args)[1] for _, args in cases]
    counted = [efficiency.expert_cost(family, args) for _, args in cases]
    assert [efficiency.budget(family, args) for _, args in cases] == traced
    assert (counted != traced) == (family_id in efficiency.TRACED_BUDGETS), [*zip(traced, counted)]


def test_gated_retentions_expert_takes_the_cheaper_of_its_two_graphs():
    """gated_retention's expert picks chunks or the recurrence by cost formulas of its own: on every
    shape of a grid over the hidden sizes, the graph it picks costs at most 4% over the cheaper of the
    two as the meter counts them, so a change to the meter cannot leave its choice stale unnoticed."""
    family = find_family("nn_modules/gated_retention_fn")[1]
    source, choice = efficiency.expert(family), "if recurrence < 0.97 * _model(T, D, E, C, dt != f64):"
    assert choice in source

    def cost(text, args):
        forced = replace(family, also_correct={**family.also_correct, "efficient": text})
        return efficiency.expert_cost(forced, args)

    g, worse = torch.Generator().manual_seed(0), []
    for t in (96, 97, 128, 161, 192, 224, 256):  # the typical draws: 96 to 224 steps; at most 256
        for d, e in ((4, 4), (4, 16), (8, 8), (16, 4), (16, 16)):
            args = {"q": torch.rand(t, d, generator=g), "k": torch.rand(t, d, generator=g),
                    "v": torch.rand(t, e, generator=g), "a": torch.rand(t, generator=g)}
            picked = cost(source, args)
            cheaper = min(cost(source.replace(choice, f"if {route}:"), args) for route in (True, False))
            if picked > 1.04 * cheaper:
                worse.append((t, d, e, picked, cheaper))
    assert not worse, worse
