"""Ending a host that holds local sandboxes, and watching its sandbox processes go: shared by
tests/test_clean_exit.py (which asserts they all go) and bench/clean_exit.py (which times it).

The processes watched are the host's descendants just before it ends (bwrap, the fork server,
supervisors, interpreters, shells), and any child any of them makes later; orphans are reparented
away from the host, so they are followed by (pid, start time), not by ancestry.
"""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import proctree

ROOT = Path(__file__).resolve().parents[2]
CASES = ("exit", "sigterm", "sigkill", "sigkill-starting")
START_TIMEOUT = 240.0  # the host and its fork server import torch; 3 sandboxes and a cell on a loaded or emulated machine


@dataclass
class Ended:
    case: str
    watched: int  # sandbox processes that ran when the host was ended
    gone_after: float | None  # seconds from the host's exit (as its parent saw it) to none left; None: never
    left: list[str]  # what still ran when the watch gave up
    started: bool  # starting case: whether the fork server had answered before the kill


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def is_sandbox_python(pid: int) -> bool:
    """The fork server's interpreter (or one forked from it), not the bwrap that runs it."""
    args = cmdline(pid).split(" ")
    return "ptenv.inside.main" in args and os.path.basename(args[0]) != "bwrap"


def _descendants(host: subprocess.Popen) -> dict[int, int]:
    return {pid: start for pid, start in proctree.tree([host.pid]).items() if pid != host.pid}


def _stable_descendants(host: subprocess.Popen, settle: float = 0.5) -> dict[int, int]:
    """The host's descendants once the pool has stopped growing (the same set `settle` s apart)."""
    seen = _descendants(host)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        time.sleep(settle)
        now = _descendants(host)
        if now == seen:
            return now
        seen = now
    return seen


def _readline(host: subprocess.Popen) -> str:
    line = host.stdout.readline()
    if not line:
        raise RuntimeError(f"the host exited early: {host.wait()} {host.stderr.read()}")
    return line.strip()


def end_host(case: str, timeout: float = 30.0, python: str = sys.executable) -> Ended:
    """Start a host with sandboxes, end it as `case` says, and watch until its sandbox processes are
    gone (at most `timeout` s past its exit)."""
    mode = "starting" if case == "sigkill-starting" else "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    host = subprocess.Popen([python, "-m", "tests.support.clean_exit_host", mode], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = True
    try:
        if mode == "starting":
            assert _readline(host) == "starting"
            # Kill once the fork server's interpreter runs (it is importing torch), before it answers.
            deadline = time.monotonic() + START_TIMEOUT
            while not any(map(is_sandbox_python, _descendants(host))):
                assert time.monotonic() < deadline, "the fork server never started"
                time.sleep(0.002)
            watched = _descendants(host)
            os.kill(host.pid, signal.SIGKILL)
        else:
            assert _readline(host) == "ready"
            watched = _stable_descendants(host)
            if case == "exit":
                host.stdin.write("exit\n")
                host.stdin.flush()
            else:
                os.kill(host.pid, signal.SIGTERM if case == "sigterm" else signal.SIGKILL)
        host.wait(timeout=60)
        exited = time.monotonic()
        if mode == "starting":
            started = "ready" in host.stdout.read()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    known = dict(watched)
    while True:
        live = proctree.survivors(known)
        if not live:
            return Ended(case, len(watched), time.monotonic() - exited, [], started)
        if time.monotonic() - exited > timeout:
            return Ended(case, len(watched), None, [f"{pid} {cmdline(pid)[:120]}" for pid in live], started)
        known.update(proctree.tree(live))  # a child made since the snapshot is watched too
        time.sleep(0.01)
