"""The main job, as an automated test: scripts/selfcheck.py drives the real vf-eval CLI with the
scripted policies (reference 45/45, null 0/45, reference -r 3 -c 16), with nothing left running,
and prints each run's report."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.vf_eval import MARK, leftover_sandboxes

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_selfcheck_passes_through_the_real_vf_eval():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "selfcheck.py")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=880,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("reference -n 45 -r 1 ") and "45/45 at 1.0, 0 scoring_error -> ok" in line for line in lines)
    assert any(line.startswith("null ") and "0/45 at 1.0, 0 scoring_error -> ok" in line for line in lines)
    assert any("-r 3 -c 16" in line and "135/135 at 1.0, 0 scoring_error -> ok" in line for line in lines)
    assert lines[-1] == "self-check passed"
    # Each run's report, under its line: the whole run's row of the results and of the failure reasons.
    # Cells carry a 95% interval after the value ("1.000 [1.000, 1.000]"): compare the values here.
    report = [line for line in lines if line.startswith("    all ")]
    assert "1.000 [1.000, 1.000]" in report[0] and "0.000 [0.000, 0.000]" in report[2]
    rows = [[cell for cell in line.split() if not cell.startswith("[") and not cell.endswith("]")] for line in report]
    assert rows == [
        ["all", "45", "1.000", "1.000", "0", "1.000"], ["all", "45", *["0"] * 8],
        ["all", "45", "0.000", "0.000", "0", "1.000"], ["all", "0", "45", *["0"] * 7],
        ["all", "135", "1.000", "1.000", "1.000", "1.000", "0", "1.000"], ["all", "135", *["0"] * 8],
    ]


def test_leftover_check_sees_a_process_of_this_run():
    name, value = MARK.decode().split("=")
    child = subprocess.Popen(["sleep", "30"], env={**os.environ, name: value})
    try:
        assert any(line.startswith(f"{child.pid}:") for line in leftover_sandboxes())
    finally:
        child.kill()
        child.wait()
    assert not leftover_sandboxes()
