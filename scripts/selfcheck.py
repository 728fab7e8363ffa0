"""The harness self-check an RL researcher runs before spending GPU hours: scripted policies
through the real `vf-eval` CLI against the local sandbox.

    reference  every rollout 1.0, no scoring_error   (the harness can award full marks)
    null       every rollout 0.0, no scoring_error   (doing nothing earns nothing)
    reference  again with -r 3 -c 16                 (the same under concurrency)

After each run no sandbox process may be left. Exits non-zero if anything differs. Each run's
report (python -m ptenv.report) is printed under its line, after the sandbox mode line.
`--short` runs the same three on 5 prompts (-r 2 -c 4 for the third), for slow machines
(scripts/test-guest's emulated guest).
"""

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from tests.support.policy_server import serve_in_thread
from tests.support.vf_eval import leftover_sandboxes, run_eval
from ptenv.host.local import isolation_mode
from ptenv.report.render import report_text
from ptenv.report.runs import RunError, load_run
from ptenv.report.stats import group

RUNS = [
    ("reference", 1.0, ["-n", "45", "-r", "1"]),
    ("null", 0.0, ["-n", "45", "-r", "1"]),
    ("reference", 1.0, ["-n", "45", "-r", "3", "-c", "16"]),
]
SHORT_RUNS = [
    ("reference", 1.0, ["-n", "5", "-r", "1"]),
    ("null", 0.0, ["-n", "5", "-r", "1"]),
    ("reference", 1.0, ["-n", "5", "-r", "2", "-c", "4"]),
]


def check(policy: str, want: float, rows: list[dict], expected_rows: int) -> list[str]:
    problems = []
    if len(rows) != expected_rows:
        problems.append(f"{len(rows)} rollouts, expected {expected_rows}")
    off = [r["info"]["task_id"] for r in rows if r["reward"] != want]
    errors = [f"{r['info']['task_id']}: {r['scoring_error']}" for r in rows if r.get("scoring_error") is not None]
    if off:
        problems.append(f"{len(off)} rollouts not at {want}: {off[:5]}")
    if errors:
        problems.append(f"{len(errors)} scoring errors: {errors[:5]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="5 prompts per run")
    runs = SHORT_RUNS if parser.parse_args().short else RUNS
    print(f"sandbox mode: {isolation_mode()}", flush=True)
    url, stop = serve_in_thread()
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
            for i, (policy, want, args) in enumerate(runs):
                results, rows = run_eval(url, policy, args, Path(tmp) / str(i))
                expected_rows = int(args[args.index("-n") + 1]) * int(args[args.index("-r") + 1])
                problems = check(policy, want, rows, expected_rows) + [
                    f"left running: {p}" for p in leftover_sandboxes()
                ]
                try:
                    run = load_run(results)
                    report = report_text(run, group(run.rollouts), None)
                except RunError as e:
                    report = ""
                    problems.append(f"report: {e}")
                hits = sum(r["reward"] == 1.0 for r in rows)
                errors = sum(r.get("scoring_error") is not None for r in rows)
                verdict = "FAIL: " + "; ".join(problems) if problems else "ok"
                print(f"{policy:<9} {' '.join(args):<20} {hits}/{len(rows)} at 1.0, "
                      f"{errors} scoring_error -> {verdict}", flush=True)
                print(textwrap.indent(report, "    "), flush=True)
                failed |= bool(problems)
    finally:
        stop()
    print("self-check FAILED" if failed else "self-check passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
