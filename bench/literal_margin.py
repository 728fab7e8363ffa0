"""How far each function family's `literal` implementation (the contract's words as code) lands
from the reference on kept hidden sets, in tolerances (issue 35).

    .venv/bin/python bench/literal_margin.py [--keys 200] [--family SUBSTRING ...]

For every family and `keys` secrets: the gated set of 8 cases (functions.gated_draw), then on
each kept case the largest |a - e| / (ATOL + RTOL * |e|) over the outputs, of
- literal: the literal's float32 outputs against the reference's (what a rollout's grader sees);
- reference: the reference's float64 recompute, cast down, against its float32 outputs (the gate).
Also the draws a set took, and how many of them the literal alone rejected. A literal within half a
tolerance stays on the same side of the gate when another CPU moves both results by a quarter
(tests/test_cpu_independence.py); 0 means every output agrees to the bit.
"""

import argparse
import statistics

import torch

from ptenv.tasks import functions
from ptenv.tasks.families import float64_inputs, tolerance_ratio
from ptenv.tasks.tiers import FUNCTION_TIERS


def worst(outputs, expected) -> float:
    return max([0.0] + [tolerance_ratio(o, e) for o, e in zip(outputs, expected) if e.is_floating_point()])


def literal_only(problems: list[str]) -> bool:
    """Whether the literal is the only implementation a draw's gates complained about."""
    mine = [p for p in problems if "'literal'" in p or ": literal moves by" in p]
    return bool(mine) and len(mine) == len(problems)


def margins(family, keys: int) -> tuple[float, float, float, int]:
    """(worst literal ratio, worst reference ratio, mean draws per set, draws the literal alone rejected)."""
    literal, reference, draws, rejected = 0.0, 0.0, [], 0
    for k in range(keys):
        key = f"margin#{k}"
        for draw in range(functions.MAX_DRAWS):
            problems, graded = functions.set_problems(family, family.draw(key, functions.DEFAULT_HIDDEN_CASES, draw))
            rejected += literal_only(problems)
            if not problems:
                break
        draws.append(draw + 1)
        for _, args, expected in graded:
            ours = functions.as_outputs(functions.call(family.also_correct["literal"], family.name, args))
            literal = max(literal, worst(ours, expected))
            recomputed = functions.call(family.reference, family.name, float64_inputs(args), torch.float64)
            reference = max(reference, worst([r.to(e.dtype) for r, e in zip(functions.as_outputs(recomputed), expected)],
                                             expected))
    return literal, reference, statistics.mean(draws), rejected


def main(keys: int, only: list[str]) -> None:
    print(f"{'family':42s} {'literal':>8s} {'reference':>10s} {'draws':>6s} {'literal alone rejected':>23s}")
    for family in [f for members in FUNCTION_TIERS.values() for f in members]:
        if only and not any(s in family.id for s in only):
            continue
        literal, reference, draws, rejected = margins(family, keys)
        print(f"{family.id:42s} {literal:8.3f} {reference:10.3f} {draws:6.2f} {rejected:23d}", flush=True)
    print(f"(worst tolerance ratio on the kept cases of {keys} secrets x {functions.DEFAULT_HIDDEN_CASES} cases)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=200, help="secrets per family (default 200)")
    parser.add_argument("--family", nargs="*", default=[], help="only families whose id contains one of these")
    args = parser.parse_args()
    main(args.keys, args.family)
