"""The model's bash commands, the supervisor's side: each runs as `/bin/sh -c` on the model's side,
its output captured and paced (streams.py), within its time limit and the sandbox's memory."""

import os
import signal
import subprocess
import time

from ptenv.inside.memory import MEMORY_POLL
from ptenv.inside.protocol import model_text, one_line, readable
from ptenv.inside.streams import Capture, paced, read_available, read_paced


def run(supervisor, command: str, cwd: str, timeout: float) -> dict:
    limits = supervisor.limits
    out, err = Capture(limits.output_bytes), Capture(limits.output_bytes)
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=supervisor.env, process_group=0, preexec_fn=lambda: child(supervisor, cwd),
        )
    except OSError as e:
        return {"stdout": "", "stderr": f"sh: cannot start /bin/sh: {e.strerror}\n", "exit_code": 2}
    except (ValueError, subprocess.SubprocessError) as e:  # a NUL byte or a lone surrogate: the model's text
        return {"stdout": "", "stderr": f"sh: cannot run this command: {model_text(one_line(e, 200))}\n", "exit_code": 2}
    pidfd = os.pidfd_open(process.pid)
    streams = {process.stdout.fileno(): out, process.stderr.fileno(): err}
    for fd in streams:
        os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout
    over_memory = False
    while True:
        left = deadline - time.monotonic()
        open_streams, pace = paced(streams, MEMORY_POLL)
        ready = readable([pidfd, supervisor.channel, *open_streams], min(max(left, 0), supervisor.memory.until_look(), pace))
        supervisor.exit_if_deleted(ready)
        for fd, sink in streams.items():
            read_paced(fd, sink)
        over_memory = supervisor.memory.over()
        if pidfd in ready or left <= 0 or over_memory:
            break
    for fd, sink in streams.items():
        read_available(fd, sink)  # what the shell wrote last
    timed_out = pidfd not in ready and not over_memory
    if over_memory:
        err.feed(f"\n[killed: the sandbox used more than its {limits.memory_mb} MiB of memory]\n".encode())
    if timed_out or over_memory:
        kill(process.pid, pidfd)
    # The command is over when the shell exits; a background job may keep the pipes open.
    # SIGKILL reaches the shell through its pidfd wherever it moved, so this wait is short; it
    # is bounded all the same, and a shell still there after it is reaped later (Supervisor.reap).
    try:
        status = process.wait(limits.grace)
    except subprocess.TimeoutExpired:
        status, timed_out = None, True
    process.stdout.close()
    process.stderr.close()
    os.close(pidfd)
    if timed_out:
        return {"timed_out": True}
    return {"stdout": out.with_notice(), "stderr": err.with_notice(), "exit_code": status if status >= 0 else 128 - status}


def child(supervisor, cwd: str) -> None:
    """In the shell's process, between fork and exec."""
    try:
        supervisor.enter_model_side(cwd)
    except OSError as e:
        os.write(2, f"sh: cd: {cwd}: {e.strerror}\n".encode())
        os._exit(2)
    # At the sandbox's memory limit the kernel kills a shell's processes before the interpreter
    # (and the variables in it).
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a shell gets the usual defaults
        signal.signal(sig, signal.SIG_DFL)


def kill(pid: int, pidfd: int) -> None:
    """Kill a shell command's processes: the shell itself through its pidfd (wherever it moved), and
    its process group. Where the sandbox's PID namespace is ours, the sweep after every request then
    kills what left the group."""
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
