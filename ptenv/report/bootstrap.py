"""95% intervals by a bootstrap over prompts: resample a group's prompts with replacement, each
with all its rollouts, recompute the statistic, and take the 2.5% and 97.5% quantiles of the
RESAMPLES values. Whole prompts, because a prompt's rollouts are correlated (an easy task passes
them all): resampling rollouts one by one would claim more certainty than the run holds.

A statistic is a ratio of per-prompt sums, so one weight matrix (how often each resample draws
each prompt) gives every statistic of a group at once: pass@k is the mean of the prompts' pass@k
(denominator 1 each), the mean reward is the rewards' sum over the rollouts' count. Seeded: the
same runs give the same report.
"""

import numpy as np

NAME = "95% bootstrap over prompts"
RESAMPLES = 2000
LEVEL = 0.95
SEED = 0


def draws(prompts: int, rng: np.random.Generator) -> np.ndarray:
    """RESAMPLES x prompts: how often each resample (of `prompts` draws) drew each prompt."""
    picked = rng.integers(0, prompts, size=(RESAMPLES, prompts))
    flat = (picked + np.arange(RESAMPLES)[:, None] * prompts).ravel()  # one bincount for every resample
    return np.bincount(flat, minlength=RESAMPLES * prompts).reshape(RESAMPLES, prompts).astype(float)


def ratios(weights: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Per resample (row) and statistic (column): the weighted sum of num over that of den."""
    return (weights @ num) / (weights @ den)


def quantiles(values: np.ndarray) -> list[tuple[float, float]]:
    """Per column, the interval between the (1 - LEVEL) / 2 and (1 + LEVEL) / 2 quantiles, each a
    value some resample took (inverted CDF: no interpolation between resamples)."""
    low, high = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0, method="inverted_cdf")
    return [(float(lo), float(hi)) for lo, hi in zip(low, high)]


def intervals(num: np.ndarray, den: np.ndarray) -> list[tuple[float, float] | None]:
    """Each statistic's interval (num, den: prompts x statistics); None with one prompt, which has
    no spread to resample."""
    if len(num) < 2:
        return [None] * num.shape[1]
    return quantiles(ratios(draws(len(num), np.random.default_rng(SEED)), num, den))


def delta_intervals(a: tuple, b: tuple, paired: bool) -> list[tuple[float, float] | None]:
    """Each statistic's interval of B - A, a and b each (num, den). Paired (the same prompts, in the
    same order, in both): one draw of prompts for both runs, so what a prompt does in both cancels
    out. Unpaired: each run's prompts drawn on their own. None unless each side has 2 prompts."""
    if min(len(a[0]), len(b[0])) < 2:
        return [None] * a[0].shape[1]
    rng = np.random.default_rng(SEED)
    weights_a = draws(len(a[0]), rng)
    weights_b = weights_a if paired else draws(len(b[0]), rng)
    return quantiles(ratios(weights_b, *b) - ratios(weights_a, *a))
