"""python -m ptenv.report on a real run of the verifiers 0.4 vf-eval (traces.jsonl), and compared
with a classic run: the report says the runs were made under different versions.

Runs where verifiers 0.4 is installed (scripts/test runs it in .venv-v1); on the classic venv tests/conftest.py
leaves it out.
"""

import shutil
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from ptenv.tasks.splits import split_version
from tests.support.report_runs import (ROOT, classic_eval, expected_reasons, expected_rows, markdown_tables,
                         mixed_policy, outcomes, policy_server, report, v1_eval, value_of)

pytestmark = [pytest.mark.v1, pytest.mark.slow]  # every test reads a real vf-eval run

VF_EVAL = Path(sys.executable).with_name("vf-eval")
CLASSIC_VF_EVAL = ROOT / ".venv" / "bin" / "vf-eval"
TASKS = ["--select.include.idx", "0:45:6"]  # 8 tasks, every category


@pytest.fixture(scope="module")
def policy_url():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(policy_server.POLICIES, "mixed", mixed_policy())
        url, stop = policy_server.serve_in_thread()
        yield url
        stop()


@pytest.fixture(scope="module")
def mixed(policy_url, tmp_path_factory) -> Path:
    return v1_eval(VF_EVAL, policy_url, "mixed", tmp_path_factory.mktemp("v1"), *TASKS, "-r", "2")


def test_the_report_of_a_v1_run_matches_its_recorded_traces(mixed, tmp_path):
    done = report(mixed.parent, "--out", tmp_path)
    assert done.returncode == 0, done.stderr

    expected = expected_rows(outcomes(mixed))
    assert len(expected) == 6  # the five categories and "all"
    tables = markdown_tables((tmp_path / "report.md").read_text())
    rows = {row["category"]: row for row in tables["Results"]}
    for category, numbers in expected.items():
        for column, value in numbers.items():
            assert value_of(rows[category][column]) == (f"{value:.3f}" if isinstance(value, float) else str(value)), column
    everything = tables["Failure reasons (rollouts)"][-1]
    assert {k: int(v) for k, v in everything.items() if k not in ("category", "tier") and v != "0"} \
        == expected_reasons(8, 2)
    versions = (f"pytorch-env {metadata.version('pytorch-env')}, splits {split_version()}, torch {torch.__version__}, "
                "verifiers 0.4.0")
    assert f"versions: {versions}" in done.stdout.splitlines()
    assert "verifiers line: v1, model: mixed, 8 prompts, 16 rollouts" in done.stdout.splitlines()


@pytest.mark.skipif(not CLASSIC_VF_EVAL.exists(), reason="needs the classic venv (./scripts/setup classic)")
def test_comparing_a_classic_run_with_a_v1_run_says_the_versions_differ(policy_url, mixed, tmp_path):
    classic = classic_eval(CLASSIC_VF_EVAL, policy_url, "reference", tmp_path / "classic", "-n", "8", "-r", "1")
    done = report("--compare", classic, mixed, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "versions differ: verifiers 0.3.1 (A) vs 0.4.0 (B)" in done.stdout.splitlines()
    assert "- versions differ: verifiers 0.3.1 (A) vs 0.4.0 (B)" in (tmp_path / "compare.md").read_text()


def test_a_truncated_traces_file_gets_one_line(mixed, tmp_path):
    text = mixed.read_text()
    for name, cut in (("mid-line", text[:-100]), ("at-line-end", text[:text.rindex("\n", 0, -1) + 1])):
        path = shutil.copytree(mixed.parent, tmp_path / name) / "traces.jsonl"  # with the run's config
        path.write_text(cut)
        done = report(path)
        assert done.returncode == 1 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and f"{path}" in done.stderr and "truncated: " in done.stderr
    assert not list(tmp_path.rglob("report.*"))
