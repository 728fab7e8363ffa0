"""The drawing process (ptenv/env/drawer.py): the host's hidden cases and budgets, drawn in a process
of its own, come back as drawn here; its death fails only the jobs it held; it dies with the host."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptenv.env.drawer import Drawer, DrawError
from ptenv.tasks import efficiency
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.tiers import find_family
from tests.support.sandbox import wait_until

FAMILY = "tensor_ops/trimmed_mean_fn"  # has the efficiency level: budgets too


def alike(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and x[1].keys() == y[1].keys()
        and all(torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v for u, v in zip(x[1].values(), y[1].values()))
        and all(torch.equal(u, v) for u, v in zip(x[2], y[2]))
        for x, y in zip(a, b))


def test_cases_and_budgets_come_back_as_drawn_here():
    drawer, family = Drawer(), find_family(FAMILY)[1]
    try:
        there = drawer.submit("cases", "a secret", 8, FAMILY, 5, "a nonce").result(timeout=120)
        here = HiddenCases("a secret", 8).of(family, 5, "a nonce")
        assert alike(there, here)
        assert drawer.submit("budgets", FAMILY, there).result(timeout=120) == efficiency.budgets(family, here)
        other = drawer.submit("cases", "a secret", 8, FAMILY, 5, "another nonce").result(timeout=120)
        assert not alike(other, here)
    finally:
        os.kill(drawer.pid, signal.SIGKILL)


def test_a_failed_job_is_a_draw_error_with_its_message():
    drawer = Drawer()
    try:
        with pytest.raises(DrawError, match="no_such_family"):
            drawer.submit("cases", "s", 8, "tensor_ops/no_such_family", 0, "n").result(timeout=120)
        assert len(drawer.submit("cases", "s", 8, FAMILY, 0, "n").result(timeout=120)) == 8  # it goes on
    finally:
        os.kill(drawer.pid, signal.SIGKILL)


def test_a_killed_drawing_process_fails_its_jobs_and_the_next_job_starts_another():
    drawer = Drawer()
    drawer.submit("cases", "s", 8, FAMILY, 0, "warm").result(timeout=120)
    first = drawer.pid
    held = [drawer.submit("cases", "s", 8, "autograd/layer_norm_backward_fn", 3, f"held {k}") for k in range(20)]
    os.kill(first, signal.SIGKILL)
    outcomes = [f.exception(timeout=120) for f in held]
    assert any(isinstance(e, DrawError) and "the drawing process exited (code -9)" in str(e) for e in outcomes)
    assert all(e is None or isinstance(e, DrawError) for e in outcomes)
    assert len(drawer.submit("cases", "s", 8, FAMILY, 0, "after").result(timeout=120)) == 8
    assert drawer.pid not in (None, first)
    os.kill(drawer.pid, signal.SIGKILL)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_job_whose_rollout_ended_while_it_waited_is_never_run():
    drawer, slow = Drawer(), "autograd/layer_norm_backward_fn"  # every listed implementation, twice
    try:
        drawer.submit("cases", "s", 8, slow, 3, "warm").result(timeout=120)
        before = cpu_seconds(drawer.pid)
        for future in [drawer.submit("cases", "s", 8, slow, 3, f"run {k}") for k in range(5)]:
            future.result(timeout=120)
        five = cpu_seconds(drawer.pid) - before
        first = drawer.submit("cases", "s", 8, slow, 3, "first")  # sent at once: the process is idle
        waiting = [drawer.submit("cases", "s", 8, slow, 3, f"cancelled {k}") for k in range(40)]
        assert sum(f.cancel() for f in waiting) >= 38  # all but one or two on a busy machine: not sent yet
        before = cpu_seconds(drawer.pid)
        first.result(timeout=120)
        assert len(drawer.submit("cases", "s", 8, FAMILY, 0, "after").result(timeout=120)) == 8
        assert cpu_seconds(drawer.pid) - before < five  # the cancelled cost nothing there
    finally:
        os.kill(drawer.pid, signal.SIGKILL)


HOST = """
import sys
from ptenv.env.drawer import Drawer
drawer = Drawer()
drawer.submit("cases", "s", 8, "tensor_ops/trimmed_mean_fn", 0, "n").result(timeout=120)
for k in range(50):  # the process is busy when its host dies
    drawer.submit("cases", "s", 8, "autograd/layer_norm_backward_fn", 3, str(k))
print(drawer.pid, flush=True)
sys.stdin.read()
"""


def test_the_drawing_process_dies_with_its_host():
    host = subprocess.Popen([sys.executable, "-c", HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pid = int(host.stdout.readline())
    assert b"ptenv.env.drawer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    host.kill()
    host.wait()
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists() or is_zombie(pid), 10)


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
