"""The report's intervals (ptenv.report.bootstrap): each checked against the bootstrap enumerated
exactly on small groups, --compare's mark on synthetic runs with and without a difference, and
the intervals in every output. Synthetic runs only: no sandbox, no vf-eval."""

import csv
import itertools
import math
import random
from pathlib import Path

import pytest
from matplotlib.container import BarContainer

from ptenv.report.build import by_tier
from ptenv.report.plot import figure
from ptenv.report.runs import Rollout, load_run, tier_label
from ptenv.report.stats import compare, group, pass_at_k, summarize
from tests.support.report_runs import markdown_tables, png_size, report, synthetic_run

ROOT = Path(__file__).resolve().parents[1]


def rollouts(rewards: dict[str, list[float]]) -> list[Rollout]:
    return [Rollout(task, task.split("/")[0], "basic", x, "pass" if x == 1.0 else "values", ())
            for task, xs in rewards.items() for x in xs]


def exact_interval(values: list[float]) -> tuple[float, float]:
    """The 2.5% and 97.5% quantiles (inverted CDF) of a statistic over every equally likely resample.

    2000 resamples put each end's level within about 0.004 (one standard deviation) of the exact
    one; the cases here keep the exact CDF at least 0.005 from 2.5% and 97.5% on both sides of each
    end, so the bootstrap lands on the exact quantile rather than a neighbour."""
    values = sorted(values)
    n = len(values)
    low, high = values[math.ceil(0.025 * n) - 1], values[math.ceil(0.975 * n) - 1]
    for end, level in ((low, 0.025), (high, 0.975)):
        below, up_to = sum(v < end - 1e-12 for v in values) / n, sum(v <= end + 1e-12 for v in values) / n
        assert below <= level - 0.005 and up_to >= level + 0.005, "too close to call: pick another case"
    return low, high


def pass_rate(xs: list[float], k: int = 1) -> float:
    return pass_at_k(len(xs), xs.count(1.0), k)


def test_a_groups_intervals_are_its_bootstrap_over_prompts_enumerated_exactly():
    # Fractional rewards (partial credit: pass only at 1.0) and unequal rollouts: the mean reward is per rollout.
    rewards = {"autograd/a": [1.0, 1.0, 1.0], "autograd/b": [1.0, 0.0, 0.0], "autograd/c": [0.0, 0.0, 0.0, 0.5],
               "autograd/d": [1.0, 1.0, 0.25]}
    stats = summarize(("autograd", "basic"), rollouts(rewards))
    resamples = list(itertools.product(rewards.values(), repeat=4))  # 256 ordered draws of 4 prompts
    for k in (1, 2, 3):
        exact = exact_interval([sum(pass_rate(xs, k) for xs in draw) / 4 for draw in resamples])
        assert stats.pass_at[k - 1].interval == pytest.approx(exact, abs=1e-12), k
    exact = exact_interval([sum(map(sum, draw)) / sum(map(len, draw)) for draw in resamples])
    assert stats.mean_reward.interval == pytest.approx(exact, abs=1e-12)


def test_a_paired_delta_resamples_the_shared_prompts_once_for_both_runs():
    a = {"losses/a": [1.0, 0.0], "losses/b": [0.0, 0.0], "losses/c": [1.0, 1.0], "losses/d": [0.0, 1.0]}
    b = {"losses/a": [1.0, 1.0], "losses/b": [1.0, 0.0], "losses/c": [1.0, 1.0], "losses/d": [0.0, 0.0]}
    paired, pass_delta, _ = compare(summarize(("losses", "basic"), rollouts(a)), summarize(("losses", "basic"), rollouts(b)))
    assert paired and pass_delta.value == pytest.approx(0.125)
    exact = exact_interval([sum(pass_rate(b[t]) - pass_rate(a[t]) for t in draw) / 4
                            for draw in itertools.product(a, repeat=4)])
    assert pass_delta.interval == pytest.approx(exact, abs=1e-12)


def test_an_unpaired_delta_resamples_each_runs_prompts_on_their_own():
    a = {"optim/a": [1.0, 0.0], "optim/b": [0.0, 0.0], "optim/c": [1.0, 1.0]}
    b = {"optim/x": [1.0, 1.0], "optim/y": [1.0, 0.0], "optim/z": [0.5, 1.0]}
    paired, pass_delta, reward_delta = compare(summarize(("optim", "basic"), rollouts(a)),
                                               summarize(("optim", "basic"), rollouts(b)))
    assert not paired
    draws = list(itertools.product(itertools.product(a.values(), repeat=3), itertools.product(b.values(), repeat=3)))
    exact = exact_interval([sum(map(pass_rate, db)) / 3 - sum(map(pass_rate, da)) / 3 for da, db in draws])
    assert pass_delta.interval == pytest.approx(exact, abs=1e-12)
    exact = exact_interval([sum(map(sum, db)) / 6 - sum(map(sum, da)) / 6 for da, db in draws])
    assert reward_delta.interval == pytest.approx(exact, abs=1e-12)


def policy(passes: list[float], rng: random.Random, category: str = "nn_modules") -> dict[str, list[float]]:
    """4 rollouts of each prompt, the i-th passing with probability passes[i]."""
    return {f"{category}/t{i}": [float(rng.random() < p) for _ in range(4)] for i, p in enumerate(passes)}


def compare_rows(tmp_path, a: dict, b: dict) -> dict[str, dict]:
    """--compare of A (a classic run) and B (a v1 run): its Markdown table's rows by category."""
    done = report("--compare", synthetic_run(tmp_path / "a", a), synthetic_run(tmp_path / "b", b, line="v1"),
                  "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "deltas: B - A, * where its interval excludes 0" in done.stdout
    table = markdown_tables((tmp_path / "compare.md").read_text())["pass@1 and mean reward per category and tier"]
    return {row["category"]: row for row in table}


def test_compare_marks_a_planted_difference(tmp_path):
    rng = random.Random(0)
    weak, strong = policy([0.1] * 40, rng), policy([0.9] * 40, rng)
    rows = compare_rows(tmp_path / "same", weak, strong)
    assert rows.keys() == {"nn_modules", "all"}
    for row in rows.values():
        assert row["paired"] == "yes" and row["pass@1 delta"].endswith("]*") and row["mean reward delta"].endswith("]*")
    renamed = {task.replace("/t", "/other"): xs for task, xs in strong.items()}  # no prompt in common
    for row in compare_rows(tmp_path / "other", weak, renamed).values():
        assert row["paired"] == "no" and row["pass@1 delta"].endswith("]*")


def test_compare_does_not_mark_a_rerun_of_the_same_policy(tmp_path):
    rng = random.Random(0)
    passes = [rng.random() for _ in range(40)]  # per prompt: easy ones pass in both runs, hard ones in neither
    for name, (a, b) in {"rerun": (policy(passes, rng), policy(passes, rng)),
                         "identical": (policy(passes, random.Random(1)), policy(passes, random.Random(1)))}.items():
        rows = compare_rows(tmp_path / name, a, b)
        for row in rows.values():
            assert row["paired"] == "yes" and row["pass@1 delta"].endswith("]"), (name, row)  # an interval, no *
            assert row["mean reward delta"].endswith("]"), (name, row)
    assert rows["all"]["pass@1 delta"] == "0.000 [0.000, 0.000]"  # identical: every resample's delta is 0


def test_the_text_markdown_csv_and_plot_carry_the_intervals(tmp_path):
    rng = random.Random(2)
    rewards = {**policy([0.5] * 12, rng), **policy([0.7], rng, "optim")}  # optim: one prompt, no interval
    results = synthetic_run(tmp_path / "run", rewards)
    done = report(results, "--tasks", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    stats = {s.key[0]: s for s in group(load_run(results).rollouts)}
    assert stats["optim"].pass_at[0].interval is None and stats["all"].pass_at[0].interval is not None
    assert "intervals: [low, high] is a 95% bootstrap over prompts (2000 resamples, seeded), each prompt's " \
           "rollouts kept together; none for a group of one prompt" in done.stdout.splitlines()

    def shown(estimate) -> str:
        return f"{estimate.value:.3f}" + (f" [{estimate.interval[0]:.3f}, {estimate.interval[1]:.3f}]"
                                          if estimate.interval else "")

    text_rows = {line.split()[0]: line for line in done.stdout.split("\n\n")[1].splitlines()[1:]}
    markdown = {row["category"]: row for row in markdown_tables((tmp_path / "report.md").read_text())["Results"]}
    csv_rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    for category, s in stats.items():
        columns = {"pass@1": s.pass_at[0], "pass@4": s.pass_at[3], "mean reward": s.mean_reward}
        for column, estimate in columns.items():
            assert shown(estimate) in text_rows[category]
            assert markdown[category][column] == shown(estimate)
            (row,) = [row for row in csv_rows if row["category"] == category and row["task"] == ""]
            low, high = estimate.interval or ("", "")
            assert (row[f"{column} low"], row[f"{column} high"]) == tuple(x if x == "" else f"{x:.6g}" for x in (low, high))
    per_task = markdown_tables((tmp_path / "report.md").read_text())["Results per task"]
    assert all("[" not in row["pass@1"] for row in per_task[:-1]) and "[" in per_task[-1]["pass@1"]

    fig = figure(by_tier(list(stats.values()), ""), "title")
    (bars,) = [c for c in fig.axes[0].containers if isinstance(c, BarContainer)]
    segments = bars.errorbar.lines[2][0].get_segments()  # per bar: its error bar, from low to high
    assert len(segments) == 2
    for s, segment in zip([stats["nn_modules"], stats["optim"]], segments):
        low, high = s.pass_at[0].interval or (s.pass_at[0].value,) * 2
        assert (segment[0][1], segment[1][1]) == pytest.approx((low, high))
    assert png_size((tmp_path / "report.png").read_bytes()) == (800, 450)


def test_a_classic_and_a_v1_run_of_the_same_rollouts_get_the_same_report(tmp_path):
    rewards = policy([0.3] * 10, random.Random(3))
    outputs = []
    for line in ("classic", "v1"):
        assert report(synthetic_run(tmp_path / line, rewards, line=line), "--out", tmp_path / line).returncode == 0
        outputs.append((tmp_path / line / "report.csv").read_text())
    assert outputs[0] == outputs[1] and "pass@1 low" in outputs[0]


def test_function_tasks_are_grouped_by_kind_and_level_apart_from_result_tasks():
    saved = ROOT / "bench" / "results" / "qwen2.5-coder-1.5b-function-level1" / "basic"
    run = load_run(next(saved.glob("evals/*/*/results.jsonl")))
    assert {r.tier for r in run.rollouts} == {"basic-fn1"} and len(run.rollouts) == 90
    assert tier_label({"tier": "basic"}) == "basic" and tier_label({}) == "basic"
