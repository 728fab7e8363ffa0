"""The numbers of a report: per group of rollouts (a category and tier, a task, or all), pass@k and
mean reward with their intervals (ptenv.report.bootstrap), harness errors, the share of prompts
whose rollouts all scored the same, and the failure reasons; and B - A of two runs' groups."""

from collections import Counter
from dataclasses import dataclass
from math import comb

import numpy as np

from ptenv.report.bootstrap import delta_intervals, intervals
from ptenv.report.reasons import REASONS
from ptenv.report.runs import Rollout
from ptenv.tasks.canonical import CATEGORIES


@dataclass(frozen=True)
class Estimate:
    value: float
    interval: tuple[float, float] | None  # 95% bootstrap over prompts; None for a group of one prompt


class Delta(Estimate):
    """B - A of two runs, marked in the report when its interval excludes 0."""

    @property
    def excludes_zero(self) -> bool:
        return self.interval is not None and (self.interval[0] > 0 or self.interval[1] < 0)


@dataclass(frozen=True)
class Stats:
    key: tuple  # (category, tier) or (category, tier, task_id); ("all", "") for the whole run
    rollouts: int
    prompts: int
    pass_at: tuple[Estimate, ...]  # pass@1, pass@2, ... up to the fewest rollouts any prompt has
    mean_reward: Estimate
    harness_errors: int
    all_same: float  # share of prompts whose rollouts all scored the same (no signal for GRPO)
    reasons: Counter  # "pass" and REASONS -> rollouts
    rewards: dict  # task_id -> its rollouts' rewards, which a comparison resamples


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def per_prompt(rewards: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The statistics as ratios of per-prompt sums (rows: prompts; columns: pass@1 ... pass@k, each over
    1, then the reward's sum over the rollouts' count). A rollout passes with reward 1.0: partial credit
    counts in the mean reward only."""
    num = [[pass_at_k(len(v), v.count(1.0), j) for j in range(1, k + 1)] + [sum(v)] for v in rewards.values()]
    den = [[1.0] * k + [len(v)] for v in rewards.values()]
    return np.array(num, dtype=float), np.array(den, dtype=float)


def summarize(key: tuple, rollouts: list[Rollout]) -> Stats:
    rewards = {}
    for r in rollouts:
        rewards.setdefault(r.task_id, []).append(r.reward)
    num, den = per_prompt(rewards, min(len(v) for v in rewards.values()))
    values = num.sum(axis=0) / den.sum(axis=0)
    estimates = [Estimate(float(v), span) for v, span in zip(values, intervals(num, den))]
    reasons = Counter({reason: 0 for reason in ("pass", *REASONS)})
    reasons.update(r.reason for r in rollouts)
    return Stats(
        key=key,
        rollouts=len(rollouts),
        prompts=len(rewards),
        pass_at=tuple(estimates[:-1]),
        mean_reward=estimates[-1],
        harness_errors=reasons["harness error"],
        all_same=sum(len(set(v)) == 1 for v in rewards.values()) / len(rewards),
        reasons=reasons,
        rewards=rewards,
    )


def compare(a: Stats, b: Stats) -> tuple[bool, Delta, Delta]:
    """Whether paired (both runs have the same prompts), and B - A of pass@1 and of the mean reward."""
    paired = a.rewards.keys() == b.rewards.keys()
    side_a, side_b = (per_prompt(dict(sorted(s.rewards.items())), 1) for s in (a, b))  # sorted: rows aligned
    pass_span, reward_span = delta_intervals(side_a, side_b, paired)
    return (paired, Delta(b.pass_at[0].value - a.pass_at[0].value, pass_span),
            Delta(b.mean_reward.value - a.mean_reward.value, reward_span))


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
