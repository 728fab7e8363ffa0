"""A short soak: bench/soak.py (the 1000-rollout run) with 90 rollouts at concurrency 32, in its own
process so that the file descriptor and process counts are the run's alone: every rollout 1.0 with
no scoring_error, and nothing left afterwards (no process of the run, so no sandbox scratch dir, and
no file descriptor it opened)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(180)
def test_a_short_soak_leaves_nothing_behind():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--rollouts", "90"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=170)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "soak passed", done.stdout
    assert "at 1.0: 90   scoring_error: 0" in done.stdout
