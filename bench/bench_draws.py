"""The host CPU of drawing one task's gated hidden cases, per function family, with and without its
`literal` implementation among the gates.

    .venv/bin/python bench/bench_draws.py [--keys 15] [--cases 8] [--family SUBSTRING ...]

For every family: `functions.gated_draw` (draw, run the reference, its float64 recompute, every
wrong and every other correct implementation, redraw until a set passes) for `keys` secrets, once
as the family is and once with `literal` left out of `also_correct`, interleaved key by key so that
load on the machine falls on both alike. Prints the median CPU ms (the process's, not wall time)
per drawn set, the ratio, and the mean number of draws a set took (a literal that disagrees with the reference forces redraws).
The gates run single-threaded on the host (ptenv.tasks.host_state), once per task today and per
rollout if hidden cases are ever drawn per rollout.
"""

import argparse
import dataclasses
import statistics
import time

from ptenv.tasks import functions
from ptenv.tasks.tiers import FUNCTION_TIERS


def without_literal(family: functions.FunctionFamily) -> functions.FunctionFamily:
    return dataclasses.replace(family, also_correct={k: v for k, v in family.also_correct.items() if k != "literal"})


def timed_draw(family: functions.FunctionFamily, key: str, cases: int) -> tuple[float, int]:
    """(CPU ms, number of draws) of one gated set."""
    real, count = functions.set_problems, [0]

    def counted(*args):
        count[0] += 1
        return real(*args)

    functions.set_problems = counted
    try:
        start = time.process_time()
        functions.gated_draw(family, key, cases)
        return (time.process_time() - start) * 1e3, count[0]
    finally:
        functions.set_problems = real


def main(keys: int, cases: int, only: list[str]) -> None:
    chosen = [f for members in FUNCTION_TIERS.values() for f in members if not only or any(s in f.id for s in only)]
    functions.gated_draw(chosen[0], "warm-up", cases)  # lazy initialisation of torch and the grader
    print(f"{'family':42s} {'with literal':>13s} {'without':>9s} {'ratio':>6s} {'draws with':>11s} {'without':>8s}")
    rows = []
    for family in chosen:
        bare = without_literal(family)
        timings = {"with": [], "without": []}
        draws = {"with": [], "without": []}
        for k in range(keys):
            for label, fam in (("with", family), ("without", bare)):
                ms, n = timed_draw(fam, f"bench#{k}", cases)
                timings[label].append(ms)
                draws[label].append(n)
        with_ms, without_ms = statistics.median(timings["with"]), statistics.median(timings["without"])
        rows.append((with_ms, without_ms))
        print(f"{family.id:42s} {with_ms:10.1f} ms {without_ms:6.1f} ms {with_ms / without_ms:6.2f} "
              f"{statistics.mean(draws['with']):11.2f} {statistics.mean(draws['without']):8.2f}", flush=True)
    with_all, without_all = [r[0] for r in rows], [r[1] for r in rows]
    print(f"median over {len(rows)} families: {statistics.median(with_all):.1f} ms with literal, "
          f"{statistics.median(without_all):.1f} ms without; max {max(with_all):.1f} / {max(without_all):.1f} ms; "
          f"sum {sum(with_all):.0f} / {sum(without_all):.0f} ms (N={cases}, {keys} keys)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=15, help="secrets per family (default 15)")
    parser.add_argument("--cases", type=int, default=functions.DEFAULT_HIDDEN_CASES, help="hidden cases per set")
    parser.add_argument("--family", nargs="*", default=[], help="only families whose id contains one of these")
    args = parser.parse_args()
    main(args.keys, args.cases, args.family)
