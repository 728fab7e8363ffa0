"""Each benchmark runs whole at its smallest setting and prints its closing figures (the figures
themselves are measured on a quiet machine, docs/benchmarks.md). bench/soak.py is tests/test_soak.py;
bench_memory.py needs the rootless user, compare_designs.py another checkout, blind_solver.py and
difficulty.py a model: test_difficulty.py runs the latter on the scripted policies."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

SMALLEST = {  # script (and what sets a second run of it apart), its smallest arguments, a line its output must have
    "bench_env.py": (["--quick"], "targets: overhead p50"),
    "bench_scale.py": (["--smallest"], "lost 0   scoring_error 0   wrong reward 0"),
    "bench_scale.py --client openai": (["--smallest", "--client", "openai"], "lost 0   scoring_error 0   wrong reward 0"),
    "bench_sandbox.py": (["--quick"], "PSS per idle sandbox"),
    "bench_grader.py": ([], "p50"),
    "bench_hidden.py": (["--rounds", "1"], "machine CPU per rollout"),
    "bench_replies.py": ([], "JSON bomb"),
    "clean_exit.py": (["--repeat", "1"], "sigkill-starting"),
    "bench_drawer.py": (["--rollouts", "4"], "drawing in a process"),
    "bench_graph.py": (["--families", "tensor_ops/trimmed_mean_fn"], "1 of 1 families trace on every case; 1 pass"),
    "bench_budget.py": (["--families", "tensor_ops/trimmed_mean_fn"], "CPU per budget, median over 1 families"),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", SMALLEST)
def test_the_benchmark_runs_whole_at_its_smallest_setting(script):
    args, line = SMALLEST[script]
    done = subprocess.run([sys.executable, str(REPO / "bench" / script.split()[0]), *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=880)
    assert done.returncode == 0, done.stdout[-3000:]
    assert line in done.stdout, done.stdout[-3000:]
