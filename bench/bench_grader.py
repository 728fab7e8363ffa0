"""Time ptenv.grader.grade on every task's expected output and on a 1M-element tensor.

    .venv/bin/python bench/bench_grader.py

Prints p50/p99 in microseconds for a passing answer (a copy of the reference: the full comparison
runs) and a failing one (one element moved), single-threaded as on the host's scoring path.
"""

import statistics
import time
from pathlib import Path

import torch

from ptenv.tasks.rows import load_rows
from ptenv.grader import grade

ROOT = Path(__file__).resolve().parent.parent


def timings_us(answer, expected, repeats: int) -> list[float]:
    grade(answer, expected)  # warm-up: first calls pay torch's lazy initialisation
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        grade(answer, expected)
        out.append((time.perf_counter() - start) * 1e6)
    return out


def moved(expected: torch.Tensor) -> torch.Tensor:
    answer = expected.clone().reshape(-1)
    answer[-1] = answer[-1] + 1 if expected.dtype != torch.bool else ~answer[-1]
    return answer.reshape(expected.shape)


def report(label: str, samples: list[float]) -> None:
    q = statistics.quantiles(samples, n=100)
    print(f"{label:<34} n={len(samples):>6}  p50 {q[49]:>9.1f} us  p99 {q[98]:>9.1f} us")


def main() -> None:
    torch.set_num_threads(1)
    rows = load_rows(ROOT / "train.jsonl")
    sizes = sorted(row.expected.numel() for row in rows)
    print(f"torch {torch.__version__}, {len(rows)} tasks, expected numel {sizes[0]}..{sizes[-1]}")
    for label, make in (("45 tasks, passing answer", lambda e: e.clone()), ("45 tasks, one element wrong", moved)):
        samples = [t for row in rows for t in timings_us(make(row.expected), row.expected, 200)]
        report(label, samples)
    big = torch.linspace(-1.0, 1.0, 1_000_000)
    report("1M float32, passing answer", timings_us(big.clone(), big, 30))
    report("1M float32, one element wrong", timings_us(moved(big), big, 30))


if __name__ == "__main__":
    main()
