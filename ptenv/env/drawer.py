"""The drawing process: a rollout's hidden cases and its efficiency budgets are computed in a Python
process of the host's own, not on a thread of the host's, because a drawing thread holds the GIL the
event loop needs, and each of the loop's socket calls then waits for it (issue 36: docs/benchmarks.md).
Trusted code on the host's side of the boundary: nothing of the model's reaches it.

    python -m ptenv.env.drawer FD PARENT_PID    # the process: jobs in, outcomes out, on socket FD
"""

import concurrent.futures
import itertools
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import ptenv
from ptenv.inside.protocol import one_line, recv_frame, send_frame

MAX_FRAME = 1 << 30  # both ends are ours: a cap against a broken frame, not against an adversary


class DrawError(RuntimeError):
    """A job that failed in the drawing process, or the process itself."""


class Drawer:
    """Jobs for the drawing process, which starts with the first; each job's outcome a Future. A
    process that dies fails the jobs it held, and the next job starts another."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._outbox: queue.SimpleQueue | None = None  # the live process's jobs, in order
        self.pid: int | None = None  # the live process (benchmarks count its CPU)

    def submit(self, job: str, *args) -> concurrent.futures.Future:
        """Run JOBS[job](*args) there. Never blocks: the jobs go out on a thread of their own."""
        future = concurrent.futures.Future()
        with self._lock:
            if self._outbox is None:
                self._outbox = queue.SimpleQueue()
                # Owns the process, which dies with the thread that started it (PDEATHSIG): this
                # thread lives until the process has ended.
                threading.Thread(target=self._serve, args=(self._outbox,), name="ptenv-drawer", daemon=True).start()
            job_id = next(self._ids)
            self._pending[job_id] = future
            self._outbox.put((job_id, job, args))
        return future

    def _serve(self, outbox: queue.SimpleQueue) -> None:
        ours, theirs = socket.socketpair()
        # This process's ptenv first, wherever it came from: the same code draws the same cases.
        path = os.pathsep.join([str(Path(ptenv.__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])])
        try:
            process = subprocess.Popen([sys.executable, "-m", "ptenv.env.drawer", str(theirs.fileno()), str(os.getpid())],
                                       pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       env={**os.environ, "PYTHONPATH": path})
        except OSError as e:
            ours.close()
            self._fail(outbox, f"cannot start the drawing process: {one_line(e)}")
            return
        finally:
            theirs.close()
        self.pid = process.pid
        # One job there at a time, so that a job whose rollout ended while it waited is never run.
        idle = threading.Semaphore()
        threading.Thread(target=self._receive, args=(ours, process, outbox, idle), name="ptenv-drawer-replies",
                         daemon=True).start()
        while idle.acquire() and (item := outbox.get()) is not None:
            with self._lock:  # beside _fail, which takes the jobs still pending under it
                future = self._pending.get(item[0])
                sending = future is not None and future.set_running_or_notify_cancel()
                if not sending:
                    self._pending.pop(item[0], None)
            if not sending:  # failed already, or its rollout ended while it waited
                idle.release()
                continue
            try:
                send_frame(ours, pickle.dumps(item))
            except OSError:
                break  # the process is gone: _receive fails what it held
        process.wait()

    def _receive(self, ours: socket.socket, process: subprocess.Popen, outbox: queue.SimpleQueue,
                 idle: threading.Semaphore) -> None:
        try:
            while (frame := recv_frame(ours, MAX_FRAME)) is not None:
                job_id, ok, value = pickle.loads(frame)
                with self._lock:
                    future = self._pending.pop(job_id)
                idle.release()
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(DrawError(value))
        except (OSError, ValueError):
            pass
        ours.close()
        process.kill()
        code = process.wait()
        self._fail(outbox, f"the drawing process exited (code {code})")
        idle.release()  # the sending thread sees the end of its jobs

    def _fail(self, outbox: queue.SimpleQueue, reason: str) -> None:
        """The process is gone: fail its jobs, end its sending thread; the next job starts another."""
        with self._lock:
            if self._outbox is outbox:
                self._outbox, self.pid = None, None
            failed, self._pending = self._pending, {}
        outbox.put(None)
        for future in failed.values():
            if future.running() or future.set_running_or_notify_cancel():
                future.set_exception(DrawError(reason))


def draw_cases(secret: str, n: int, family_id: str, seed: int, nonce: str) -> list:
    from ptenv.tasks.functions import HiddenCases
    from ptenv.tasks.tiers import find_family

    return HiddenCases(secret, n).of(find_family(family_id)[1], seed, nonce)


def draw_budgets(family_id: str, cases: list) -> list[int]:
    from ptenv.tasks import efficiency
    from ptenv.tasks.tiers import find_family

    return efficiency.budgets(find_family(family_id)[1], cases)


JOBS = {"cases": draw_cases, "budgets": draw_budgets}


def main(fd: int, parent: int) -> None:
    from ptenv.inside.syscalls import PR_SET_PDEATHSIG, check, libc

    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != parent:  # the host died before the line above
        return
    sock = socket.socket(fileno=fd)
    while (frame := recv_frame(sock, MAX_FRAME)) is not None:  # none once the host closed its end
        job_id, job, args = pickle.loads(frame)
        try:
            reply = (job_id, True, JOBS[job](*args))
        except Exception as e:
            reply = (job_id, False, one_line(e) or type(e).__name__)
        send_frame(sock, pickle.dumps(reply))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
