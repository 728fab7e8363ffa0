"""The harness self-check an RL researcher runs before spending GPU hours: scripted policies
through the real `vf-eval` CLI against the local sandbox.

    reference  every rollout 1.0, no scoring_error   (the harness can award full marks)
    null       every rollout 0.0, no scoring_error   (doing nothing earns nothing)
    reference  again with -r 3 -c 16                 (the same under concurrency)

After each run no sandbox process may be left. Exits non-zero if anything differs. Each run's
report (python -m ptenv.report) is printed under its line.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from tests.support.policy_server import serve_in_thread
from ptenv.report.render import report_text
from ptenv.report.runs import RunError, load_run
from ptenv.report.stats import group

RUNS = [
    ("reference", 1.0, ["-n", "45", "-r", "1"]),
    ("null", 0.0, ["-n", "45", "-r", "1"]),
    ("reference", 1.0, ["-n", "45", "-r", "3", "-c", "16"]),
]
VF_EVAL = Path(sys.executable).with_name("vf-eval")
# Marks this run's processes: bwrap keeps its environment, and everything in a sandbox dies with it.
MARK = f"PTENV_SELFCHECK={uuid.uuid4().hex}".encode()


def eval_command(url: str, policy: str, args: list[str], out: Path) -> tuple[list[str], dict]:
    """The vf-eval command line and its environment, with this run's mark."""
    command = [str(VF_EVAL), "pytorch-env", "-m", policy, "-b", url, "-k", "SELFCHECK_API_KEY",
               *args, "-s", "-C", "scoring_error,verdict", "-d", "-o", str(out)]
    name, value = MARK.decode().split("=")
    return command, {**os.environ, "SELFCHECK_API_KEY": "unused", name: value}


def run_eval(url: str, policy: str, args: list[str], out: Path) -> tuple[Path, list[dict]]:
    command, env = eval_command(url, policy, args, out)
    print("$", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"vf-eval exited with {done.returncode}:\n{done.stdout[-3000:]}")
    results = sorted(out.glob("evals/*/*/results.jsonl"))
    if len(results) != 1:
        sys.exit(f"expected one results.jsonl under {out}, found {len(results)}")
    return results[0], [json.loads(line) for line in results[0].read_text().splitlines()]


def leftover_sandboxes() -> list[str]:
    """Processes this run started (vf-eval, bwrap, and so any sandbox) that are still alive."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if MARK in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                left.append(f"{pid}: {cmdline.decode()[:120]}")
        except OSError:
            continue
    return left


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
    url, stop = serve_in_thread()
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
            for i, (policy, want, args) in enumerate(RUNS):
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
