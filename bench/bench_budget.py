"""The CPU of a level-3 budget (ptenv/tasks/efficiency.py), which the drawing process computes for
every hidden case of every level-3 rollout: `budget` (the expert's cost counted as it runs, or its
graph for a family of TRACED_BUDGETS) against the traced route it replaced (`expert_run`: make_fx,
then the graph run), and whether the two agree.

    .venv/bin/python bench/bench_budget.py [--families ID ...]

One draw of the default number of hidden cases per level-3 family, in this process, the budget's
cache emptied before each; times are this process's CPU (time.process_time), per budget.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ptenv.tasks import efficiency  # noqa: E402
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES  # noqa: E402
from ptenv.tasks.tiers import FUNCTION_TIERS  # noqa: E402


def cpu_ms(work) -> tuple[object, float]:
    start = time.process_time()
    value = work()
    return value, (time.process_time() - start) * 1e3


def fresh_budget(family, args: dict) -> int:
    efficiency._budgets.clear()
    return efficiency.budget(family, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", help="family ids (default: every level-3 family)")
    chosen = parser.parse_args().families
    families = [f for tier in FUNCTION_TIERS.values() for f in tier
                if efficiency.LEVEL in f.levels and (chosen is None or f.id in chosen)]
    warm = families[0].draw("bench-budget warm-up", 1)[0][1]
    efficiency.expert_run(families[0], warm), fresh_budget(families[0], warm)  # first-use imports
    print(f"{'family':<42} {'traced ms':>10} {'budget ms':>10} {'speed-up':>9} {'agree':>6}")
    rows = []
    for family in families:
        traced, budget, agree = [], [], 0
        for _, args in family.draw("bench-budget", DEFAULT_HIDDEN_CASES):
            (_, old), old_ms = cpu_ms(lambda: efficiency.expert_run(family, args))
            new, new_ms = cpu_ms(lambda: fresh_budget(family, args))
            traced.append(old_ms)
            budget.append(new_ms)
            agree += old == new
        rows.append((family.id, statistics.mean(traced), statistics.mean(budget)))
        print(f"{family.id:<42} {rows[-1][1]:>10.1f} {rows[-1][2]:>10.1f} {rows[-1][1] / rows[-1][2]:>8.1f}x "
              f"{agree:>4}/{DEFAULT_HIDDEN_CASES}", flush=True)
    old, new = statistics.median(r[1] for r in rows), statistics.median(r[2] for r in rows)
    print(f"CPU per budget, median over {len(rows)} families (each its mean over {DEFAULT_HIDDEN_CASES} cases): "
          f"traced {old:.1f} ms, now {new:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
