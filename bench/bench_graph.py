"""The efficiency meter (ptenv/inside/graph.py, issue 38) on every function family's honest
implementation (`by_hand`, or the reference): whether it traces without values, whether its graph
run on the hidden cases passes them, its cost, and what the meter costs (CPU to trace and to run
the graph, against calling the function itself).

    .venv/bin/python bench/bench_graph.py [--families ID ...]

One set of hidden cases per family (the default number), in this process, single-threaded as the
draws run. Times are this process's CPU time (time.process_time), medians over the cases.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ptenv.grader import grade_outputs  # noqa: E402
from ptenv.inside import graph  # noqa: E402
from ptenv.inside.namespace import new_namespace  # noqa: E402
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, HiddenCases  # noqa: E402
from ptenv.tasks.host_state import reference_run  # noqa: E402
from ptenv.tasks.tiers import FUNCTION_TIERS  # noqa: E402


def cpu(work):
    start = time.process_time()
    value = work()
    return value, (time.process_time() - start) * 1e3


def measure(family) -> dict:
    namespace = new_namespace({})
    exec(compile(family.by_hand, "<by_hand>", "exec"), namespace)
    function = namespace[family.name]
    allowed = set(family.allowlist(2)["allow"])
    rows = {"traced": 0, "passed": 0, "costs": [], "trace": [], "run": [], "call": [], "why": ""}
    for _, args, expected in HiddenCases("bench-graph", DEFAULT_HIDDEN_CASES).of(family, 0):
        tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
        literals = {k: v for k, v in args.items() if k not in tensors}
        _, call_ms = cpu(lambda: function(**{k: v.clone() for k, v in tensors.items()}, **literals))
        try:
            traced, trace_ms = cpu(lambda: graph.trace(function, {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()},
                                                       literals))
            (outputs, cost), run_ms = cpu(lambda: graph.run(traced, {k: v.clone() for k, v in tensors.items()}, allowed))
        except graph.GraphError as e:
            rows["why"] = rows["why"] or str(e)[:110]
            continue
        rows["traced"] += 1
        rows["passed"] += grade_outputs(outputs, expected).score == 1.0  # as the trial grades a case
        rows["costs"].append(cost)
        rows["trace"].append(trace_ms)
        rows["run"].append(run_ms)
        rows["call"].append(call_ms)
    return rows


def med(values: list) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", help="family ids (default: every function family)")
    args = parser.parse_args()
    families = [f for tier in FUNCTION_TIERS.values() for f in tier if args.families is None or f.id in args.families]
    print(f"{'family':<42} {'traced':>6} {'passed':>6} {'cost p50':>10} {'trace ms':>9} {'run ms':>7} {'call ms':>8}")
    traced = passed = 0
    with reference_run():
        for family in families:
            r = measure(family)
            n = DEFAULT_HIDDEN_CASES
            traced += r["traced"] == n
            passed += r["passed"] == n
            print(f"{family.id:<42} {r['traced']:>4}/{n} {r['passed']:>4}/{n} {med(r['costs']):>10.0f} "
                  f"{med(r['trace']):>9.1f} {med(r['run']):>7.1f} {med(r['call']):>8.2f}  {r['why']}", flush=True)
    print(f"{traced} of {len(families)} families trace on every case; {passed} pass every case from the graph")
    return 0


if __name__ == "__main__":
    sys.exit(main())
