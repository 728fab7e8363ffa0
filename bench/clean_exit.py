"""Clean exit: how long a host's sandbox processes (bwrap, the fork server, supervisors,
interpreters) outlive it, for each way it can end: a normal exit, SIGTERM, SIGKILL, and SIGKILL
while the fork server is still importing torch. The goal is none left within 2 s of the host's exit
(tests/test_clean_exit.py asserts only that none are left, with a generous bound).

    .venv/bin/python bench/clean_exit.py [--repeat N]
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from tests.support.clean_exit import CASES, end_host  # noqa: E402

GOAL = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<18} {'processes':>9}  seconds from the host's exit to none left (goal: {GOAL:g})")
    failed = False
    for case in CASES:
        runs = [end_host(case) for _ in range(args.repeat)]
        times = [r.gone_after for r in runs]
        worst = None if None in times else max(times)
        failed |= worst is None or worst > GOAL
        shown = " ".join("never" if t is None else f"{t:.3f}" for t in times)
        median = "" if worst is None else f"  (median {statistics.median(times):.3f}, max {worst:.3f})"
        print(f"{case:<18} {max(r.watched for r in runs):>9}  {shown}{median}")
        for r in runs:
            for line in r.left:
                print(f"    left: {line}")
            if case == "sigkill-starting" and r.started:
                print("    (this run's fork server had started before the kill)")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
