"""python -m ptenv.report on real runs of the classic (0.3.1) vf-eval: a `mixed` run that shows
every failure reason and a `reference` run, both against the scripted policy server. Its numbers
are checked against the recorded rollouts read here directly, and against verifiers' own pass@k.
The verifiers 0.4 side is tests/test_report_v1.py."""

import itertools
import json
import shutil
import subprocess
import sys
import zlib
from importlib import metadata
from pathlib import Path

import pytest
import torch

from ptenv.grader import OUTCOMES
from ptenv.report.reasons import REASON_OF_OUTCOME, REASONS
from ptenv.report.runs import load_run
from ptenv.tasks.splits import split_version
from ptenv.report.stats import pass_at_k
from ptenv.tasks.canonical import CATEGORIES
from tests.support.report_runs import (ROOT, classic_eval, expected_reasons, expected_rows, markdown_tables, mixed_policy,
                         outcomes, png_size, policy_server, report, value_of)

VF_EVAL = Path(sys.executable).with_name("vf-eval")
# The same 8 tasks in both runs, from several categories.
TASKS = ["-n", "8", "--shuffle", "--shuffle-seed", "3"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(mixed run, saved with no state columns: its info holds the verdict; reference run with
    `-C scoring_error`): their output dirs."""
    out = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(policy_server.POLICIES, "mixed", mixed_policy())
        url, stop = policy_server.serve_in_thread()
        try:
            classic_eval(VF_EVAL, url, "mixed", out / "mixed", *TASKS, "-r", "2")
            classic_eval(VF_EVAL, url, "reference", out / "reference", *TASKS, "-r", "1", "-C", "scoring_error")
        finally:
            stop()
    return out / "mixed", out / "reference"


def results_of(run_dir: Path) -> Path:
    (results,) = run_dir.glob("evals/*/*/results.jsonl")
    return results


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)


@pytest.mark.slow
def test_the_report_of_a_run_matches_its_recorded_rollouts(runs, tmp_path):
    mixed, _ = runs  # `python -m ptenv.report` itself here; the other tests call its main in process
    done = subprocess.run([sys.executable, "-m", "ptenv.report", str(mixed), "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr

    expected = expected_rows(outcomes(results_of(mixed)))
    assert len(expected) > 2  # several categories, and "all"
    tables = markdown_tables((tmp_path / "report.md").read_text())
    rows = {row["category"]: row for row in tables["Results"]}
    assert rows.keys() == expected.keys()
    for category, numbers in expected.items():
        assert rows[category]["tier"] == ("" if category == "all" else "basic")
        for column, value in numbers.items():
            assert value_of(rows[category][column]) == (f"{value:.3f}" if isinstance(value, float) else str(value)), column

    reasons = {row["category"]: row for row in tables["Failure reasons (rollouts)"]}
    assert {k: int(v) for k, v in reasons["all"].items() if k not in ("category", "tier") and v != "0"} \
        == expected_reasons(8, 2)
    for category, numbers in expected.items():
        counts = [int(v) for k, v in reasons[category].items() if k not in ("category", "tier")]
        assert sum(counts) == numbers["rollouts"]
        assert int(reasons[category]["harness error"]) == numbers["harness errors"]

    # The whole run's pass@k as verifiers itself computed it (k = 1, 2), to CSV's 6 digits.
    verifiers_pass_at = json.loads(results_of(mixed).with_name("metadata.json").read_text())["pass_at_k"]
    csv_rows = [line.split(",") for line in (tmp_path / "report.csv").read_text().splitlines()]
    everything = dict(zip(csv_rows[0], csv_rows[-1]))
    assert everything["category"] == "all"
    for k, value in verifiers_pass_at.items():
        assert float(everything[f"pass@{k}"]) == pytest.approx(value, abs=1e-6)

    versions = (f"pytorch-env {metadata.version('pytorch-env')}, splits {split_version()}, torch {torch.__version__}, "
                "verifiers 0.3.1")
    assert f"versions: {versions}" in done.stdout.splitlines()
    assert f"- versions: {versions}" in (tmp_path / "report.md").read_text()
    assert done.stdout.splitlines()[-1] == f"wrote report.md, report.csv, report.png to {tmp_path}"


@pytest.mark.slow
def test_per_task_rows_with_the_flag(runs, tmp_path):
    mixed, _ = runs
    assert report(mixed, "--tasks", "--out", tmp_path).returncode == 0
    tables = markdown_tables((tmp_path / "report.md").read_text())
    per_task = tables["Results per task"]
    assert {row["task"] for row in per_task[:-1]} == {r["task"] for r in outcomes(results_of(mixed))}
    assert per_task[-1]["category"] == "all" and per_task[-1]["rollouts"] == "16"
    assert all(row["rollouts"] == "2" and row["task"].startswith(row["category"] + "/") for row in per_task[:-1])
    assert sum(int(row["pass"]) for row in tables["Failure reasons per task (rollouts)"][:-1]) == \
        expected_reasons(8, 2)["pass"]
    csv_rows = [line.split(",") for line in (tmp_path / "report.csv").read_text().splitlines()[1:]]
    assert [row[0] for row in csv_rows].count("all") == 1 and sum(row[2] != "" for row in csv_rows) == 8


@pytest.mark.slow
def test_the_plot_is_a_png_of_the_expected_size(runs, tmp_path):
    mixed, _ = runs
    assert report(mixed, "--out", tmp_path).returncode == 0
    data = (tmp_path / "report.png").read_bytes()
    assert png_size(data) == (800, 450)
    assert zlib.crc32(data[12:29]) == int.from_bytes(data[29:33], "big")  # IHDR's CRC
    assert data[-8:-4] == b"IEND"


@pytest.mark.slow
def test_compare_puts_two_runs_side_by_side_with_deltas(runs, tmp_path):
    mixed, reference = runs
    done = report("--compare", mixed, reference, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "versions differ" not in done.stdout
    expected = expected_rows(outcomes(results_of(mixed)))
    table = markdown_tables((tmp_path / "compare.md").read_text())["pass@1 and mean reward per category and tier"]
    assert [row["category"] for row in table] == [c for c in CATEGORIES if c in expected] + ["all"]
    for row in table:
        a = expected[row["category"]]
        assert (row["rollouts A"], row["rollouts B"]) == (str(a["rollouts"]), str(a["rollouts"] // 2))
        assert (value_of(row["pass@1 A"]), value_of(row["pass@1 B"])) == (f"{a['pass@1']:.3f}", "1.000")
        assert value_of(row["pass@1 delta"]) == f"{1.0 - a['pass@1']:.3f}"
        assert (row["harness errors A"], row["harness errors B"]) == (str(a["harness errors"]), "0")
    # The same 8 prompts in both: paired; the reference passes 6 prompts more than the mixed policy.
    assert table[-1]["paired"] == "yes" and table[-1]["pass@1 delta"].endswith("]*")
    assert png_size((tmp_path / "compare.png").read_bytes()) == (800, 450)


def rewritten(run_dir: Path, to: Path, change) -> Path:
    """A copy of the run whose every results row is change(row)."""
    copy = shutil.copytree(results_of(run_dir).parent, to)
    rows = [json.loads(line) for line in (copy / "results.jsonl").read_text().splitlines()]
    (copy / "results.jsonl").write_text("".join(json.dumps(change(row)) + "\n" for row in rows))
    return copy


def failure_reasons(done, out: Path) -> dict[str, int]:
    assert done.returncode == 0, done.stderr
    table = markdown_tables((out / "report.md").read_text())["Failure reasons (rollouts)"]
    everything = next(row for row in table if row["category"] == "all")
    return {k: int(v) for k, v in everything.items() if k not in ("category", "tier") and v != "0"}


def test_every_kind_of_verdict_is_a_reason_of_the_report():
    assert set(REASON_OF_OUTCOME) == set(OUTCOMES)
    assert set(REASON_OF_OUTCOME.values()) == {"pass", *REASONS}


@pytest.mark.slow
def test_the_report_counts_the_verdicts_outcome_not_its_wording(runs, tmp_path):
    mixed, _ = runs
    rows = [json.loads(line) for line in results_of(mixed).read_text().splitlines()]
    assert all(set(row["info"]["verdict"]) == {"score", "outcome", "result_present", "shape_match", "dtype_match",
                                               "values_match", "reason"} for row in rows)
    assert "verdict" not in rows[0]  # saved without `-C verdict`: the info has it anyway

    def reword(row):
        verdict = {**row["info"]["verdict"], "reason": "reworded"}
        return {**row, "info": {**row["info"], "verdict": verdict}}

    copy = rewritten(mixed, tmp_path / "run", reword)
    assert failure_reasons(report(copy, "--out", tmp_path), tmp_path) == expected_reasons(8, 2)


@pytest.mark.slow
def test_a_run_saved_before_verdicts_had_an_outcome_is_told_by_their_reasons(runs, tmp_path):
    """As bench/results: the verdict at the row's top level (`-C scoring_error,verdict`), without an outcome."""
    mixed, _ = runs

    def as_saved_then(row):
        info = {k: v for k, v in row["info"].items() if k not in ("verdict", "scoring_error")}
        verdict = {k: v for k, v in row["info"]["verdict"].items() if k != "outcome"}
        return {**row, "info": info, "verdict": verdict, "scoring_error": row["info"]["scoring_error"]}

    copy = rewritten(mixed, tmp_path / "run", as_saved_then)
    done = report(copy, "--out", tmp_path)
    assert failure_reasons(done, tmp_path) == expected_reasons(8, 2)
    assert "note:" not in done.stdout


def test_the_saved_benchmark_runs_are_still_read():
    # Runs resumed over sessions: rollouts saved before verdicts had a kind, told by their flags,
    # beside rollouts run again since (rows changed by later fixes), told by their kind.
    saved = sorted(ROOT.glob("bench/results/qwen2.5-coder-1.5b/**/results.jsonl"))
    assert saved
    kinds = 0
    for path in saved:
        run = load_run(path)
        verdicts = [json.loads(line)["verdict"] for line in path.read_text().splitlines()]
        assert run.guessed == 0 and len(verdicts) == len(run.rollouts)
        for verdict, rollout in zip(verdicts, run.rollouts):
            if "kind" in verdict:
                kinds += 1
                assert rollout.reason == REASON_OF_OUTCOME[verdict["kind"]], (path, verdict)
                continue
            flags = verdict["result_present"], verdict["shape_match"], verdict["dtype_match"], verdict["score"]
            told = {(False, False, False, 0.0): ("no result", "harness error"), (True, True, False, 0.0): ("dtype",),
                    (True, False, True, 0.0): ("shape",), (True, True, True, 0.0): ("values",),
                    (True, True, True, 1.0): ("pass",)}.get(flags, ("shape", "invalid answer"))
            assert rollout.reason in told, (path, verdict)
    assert kinds > 0  # both kinds of record were read


@pytest.mark.slow
def test_without_a_recorded_verdict_the_reasons_come_from_the_metrics(runs, tmp_path):
    mixed, _ = runs

    def without_verdict(row):
        return {**row, "info": {k: v for k, v in row["info"].items() if k != "verdict"}}

    copy = rewritten(mixed, tmp_path / "run", without_verdict)
    done = report(copy, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    reasons = {row["category"]: row for row in markdown_tables((tmp_path / "report.md").read_text())
               ["Failure reasons (rollouts)"]}
    assert {k: int(v) for k, v in reasons["all"].items() if k not in ("category", "tier") and v != "0"} \
        == expected_reasons(8, 2)
    assert "note: no verdict recorded, so 2 failed rollouts with neither shape nor dtype right count as " \
           "invalid answers" in done.stdout


def _bad_inputs(mixed: Path, reference: Path, tmp: Path) -> list[tuple[Path, str]]:
    """(input, what its one line must say), each made from the real runs."""
    def copy(name: str) -> Path:
        return shutil.copytree(results_of(mixed).parent, tmp / name)

    (tmp / "empty").mkdir()
    dataset = tmp / "dataset" / "results.jsonl"
    dataset.parent.mkdir()
    shutil.copy(ROOT / "train.jsonl", dataset)
    other = copy("other-env")
    meta = json.loads((other / "metadata.json").read_text())
    (other / "metadata.json").write_text(json.dumps({**meta, "env_id": "other-env"}))
    cut = copy("cut-mid-line") / "results.jsonl"
    cut.write_bytes(cut.read_bytes()[:-100])
    short = copy("cut-at-line-end") / "results.jsonl"
    short.write_text("".join(short.read_text().splitlines(keepends=True)[:-1]))
    both = tmp / "two-runs"
    shutil.copytree(mixed, both / "a")
    shutil.copytree(reference, both / "b")
    return [
        (tmp / "empty", "not a vf-eval output (no results.jsonl or traces.jsonl in or under it)"),
        (ROOT / "train.jsonl", "not a vf-eval output (expected results.jsonl or traces.jsonl)"),
        (dataset, "results.jsonl:1: not a verifiers results row"),
        (other, "a run of environment 'other-env', not pytorch-env"),
        (cut, "truncated: the last line is incomplete"),
        (short, "truncated: "),
        (both, "holds 2 runs"),
    ]


@pytest.mark.slow
def test_bad_input_gets_one_line_and_nothing_is_written(runs, tmp_path):
    for path, says in _bad_inputs(*runs, tmp_path):
        done = report(path)
        assert done.returncode == 1 and done.stdout == "", path
        assert len(done.stderr.splitlines()) == 1 and says in done.stderr, (path, done.stderr)
    assert not [p for p in tmp_path.rglob("*") if "report." in p.name]


@pytest.mark.slow
def test_an_unwritable_output_directory_gets_one_line(runs, tmp_path):
    done = report(runs[0], "--out", tmp_path / "missing")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1 and "No such file" in done.stderr
    assert not (tmp_path / "missing").exists()
