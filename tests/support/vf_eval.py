"""The real vf-eval CLI run as a user runs it, with this process's mark on everything it starts,
so that what a run leaves behind can be found (scripts/selfcheck.py and the tests that run vf-eval)."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

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
