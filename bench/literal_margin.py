"""How far each function family's `literal` implementation (the contract's words as code) lands
from the reference on kept hidden sets, in tolerances (issue 35).

    .venv/bin/python bench/literal_margin.py [--keys 200] [--family SUBSTRING ...]

For every family and `keys` secrets: the gated set of 8 cases (functions.gated_draw), then on
each kept case the largest |a - e| / (ATOL + RTOL * |e|) over the outputs, of
- literal: the literal's float32 outputs against the reference's (what a rollout's grader sees);
- reference: the reference's float64 recompute, cast down, against its float32 outputs (the gate).
- by_hand: the same for the family's `by_hand` implementation (made of the ops its level-2 allowlist
  allows), where it lists one ("-" otherwise).
Also the draws a set took, and how many of them the literal (or by_hand) alone rejected. A literal within half a
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


def only(name: str, problems: list[str]) -> bool:
    """Whether the correct implementation `name` is the only one a draw's gates complained about."""
    mine = [p for p in problems if f"{name!r}" in p or f": {name} moves by" in p]
    return bool(mine) and len(mine) == len(problems)


def margins(family, keys: int) -> tuple[float, float | None, float, float, int, int]:
    """(worst literal ratio, worst by_hand ratio (None without one), worst reference ratio, mean draws
    per set, draws the literal alone rejected, draws by_hand alone rejected)."""
    literal, by_hand, reference, draws, rejected, rejected_by_hand = 0.0, 0.0, 0.0, [], 0, 0
    has_by_hand = "by_hand" in family.also_correct
    for k in range(keys):
        key = f"margin#{k}"
        for draw in range(functions.MAX_DRAWS):
            problems, graded = functions.set_problems(family, family.draw(key, functions.DEFAULT_HIDDEN_CASES, draw))
            rejected += only("literal", problems)
            rejected_by_hand += only("by_hand", problems)
            if not problems:
                break
        draws.append(draw + 1)
        for _, args, expected in graded:
            ours = functions.as_outputs(functions.call(family.also_correct["literal"], family.name, args))
            literal = max(literal, worst(ours, expected))
            if has_by_hand:
                hand = functions.as_outputs(functions.call(family.also_correct["by_hand"], family.name, args))
                by_hand = max(by_hand, worst(hand, expected))
            recomputed = functions.call(family.reference, family.name, float64_inputs(args), torch.float64)
            reference = max(reference, worst([r.to(e.dtype) for r, e in zip(functions.as_outputs(recomputed), expected)],
                                             expected))
    return literal, by_hand if has_by_hand else None, reference, statistics.mean(draws), rejected, rejected_by_hand


def main(keys: int, families: list[str]) -> None:
    print(f"{'family':42s} {'literal':>8s} {'by_hand':>8s} {'reference':>10s} {'draws':>6s} "
          f"{'rejected by literal':>20s} {'by by_hand':>11s}")
    for family in [f for members in FUNCTION_TIERS.values() for f in members]:
        if families and not any(s in family.id for s in families):
            continue
        literal, by_hand, reference, draws, rejected, rejected_by_hand = margins(family, keys)
        hand = "-" if by_hand is None else f"{by_hand:.3f}"
        print(f"{family.id:42s} {literal:8.3f} {hand:>8s} {reference:10.3f} {draws:6.2f} {rejected:20d} "
              f"{rejected_by_hand:11d}", flush=True)
    print(f"(worst tolerance ratio on the kept cases of {keys} secrets x {functions.DEFAULT_HIDDEN_CASES} cases)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=200, help="secrets per family (default 200)")
    parser.add_argument("--family", nargs="*", default=[], help="only families whose id contains one of these")
    args = parser.parse_args()
    main(args.keys, args.family)
