"""The numbers of a report: per group of rollouts (a category and tier, a task, or all), pass@k,
mean reward, harness errors, the share of prompts whose rollouts all scored the same, and the
failure reasons."""

from collections import Counter
from dataclasses import dataclass
from math import comb

from ptenv.report.reasons import REASONS
from ptenv.report.runs import Rollout
from ptenv.tasks.canonical import CATEGORIES


@dataclass(frozen=True)
class Stats:
    key: tuple  # (category, tier) or (category, tier, task_id); ("all", "") for the whole run
    rollouts: int
    prompts: int
    pass_at: tuple  # pass@1, pass@2, ... up to the fewest rollouts any prompt has
    mean_reward: float
    harness_errors: int
    all_same: float  # share of prompts whose rollouts all scored the same (no signal for GRPO)
    reasons: Counter  # "pass" and REASONS -> rollouts


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(key: tuple, rollouts: list[Rollout]) -> Stats:
    rewards = {}
    for r in rollouts:
        rewards.setdefault(r.task_id, []).append(r.reward)
    fewest = min(len(v) for v in rewards.values())
    pass_at = tuple(
        sum(pass_at_k(len(v), sum(x == 1.0 for x in v), k) for v in rewards.values()) / len(rewards)
        for k in range(1, fewest + 1)
    )
    reasons = Counter({reason: 0 for reason in ("pass", *REASONS)})
    reasons.update(r.reason for r in rollouts)
    return Stats(
        key=key,
        rollouts=len(rollouts),
        prompts=len(rewards),
        pass_at=pass_at,
        mean_reward=sum(r.reward for r in rollouts) / len(rollouts),
        harness_errors=reasons["harness error"],
        all_same=sum(len(set(v)) == 1 for v in rewards.values()) / len(rewards),
        reasons=reasons,
    )


def group(rollouts: list[Rollout], by_task: bool = False) -> list[Stats]:
    """Stats per category and tier (or per task), in catalogue order, then the whole run."""
    groups = {}
    for r in rollouts:
        key = (r.category, r.tier, r.task_id) if by_task else (r.category, r.tier)
        groups.setdefault(key, []).append(r)
    everything = ("all", "", "") if by_task else ("all", "")
    return [summarize(key, groups[key]) for key in sorted(groups, key=order)] + [summarize(everything, rollouts)]


def order(key: tuple) -> tuple:
    """Categories as the catalogue lists them (unknown ones after, by name), then tier and task by name."""
    known = list(CATEGORIES)
    return (known.index(key[0]) if key[0] in known else len(known), *key)
