"""The local sandboxes' pool: a background thread keeps a few idle sandboxes forked ahead, so that
`create` is a pop and the first cell answers in milliseconds, and owns the fork server that makes
them (ptenv/inside/forkserver.py), which imports torch once. The pool heals: a fork server that dies
or stops answering is replaced, and a failed refill is retried with backoff; each failure costs
only the rollouts that were waiting on it.
"""

import asyncio
import atexit
import collections
import contextlib
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from ptenv.host.view import NO_CGROUP, NO_FALLBACK, SandboxUnavailableError, sandbox_command
from ptenv.inside import cgroups
from ptenv.inside.protocol import Limits, one_line, recv_frame

START_TIMEOUT = 180.0  # fork server start, its trial zygote's included: imports torch (5 s here; 25-90 s emulated, scripts/test-guest)
CONTROL_TIMEOUT = 30.0  # for the fork server's answer to one request, and a supervisor's first word
UID_SLOTS = 1 << 16  # each client takes a random block of uids; two per sandbox, never reused early
BACKOFF = (0.1, 5.0)  # seconds between refill attempts after a failure: first, and at most


class ControlError(SandboxUnavailableError):
    """The fork server died or stopped answering: it is replaced."""


@dataclass
class Box:
    id: str
    pid: int  # of its supervisor, as the fork server sees it
    uid: int  # of its supervisor; the model's is uid + 1
    sock: socket.socket
    server: str = "main"  # the fork server that made it: "main", or "trial" (the trial zygote)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    requests: itertools.count = field(default_factory=itertools.count)
    dead: str | None = None  # why it no longer answers

    def is_alive(self) -> bool:
        """Its supervisor has not closed its channel (idle in the pool, it sends nothing else)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False



class Pool:
    def __init__(self, limits: Limits, size: int, allowlist_base: list[str] | None):
        self.limits = limits
        self.size = size  # idle sandboxes kept ready
        # The widest allowlist of any trial: the trial zygote installs it once (inside/main.py), so a
        # trial's sandbox made there only adds its family's removals. None: no trial zygote.
        self.allowlist_base = allowlist_base
        self.cgroup_mode = "not started"  # what the kernel enforces per sandbox, once the fork server runs
        self.forkserver: subprocess.Popen | None = None
        self._idle: collections.deque[Box] = collections.deque()  # guarded by _cond
        self._cond = threading.Condition()
        self._waiting = 0
        self._failure: Exception | None = None  # the refill's latest failure, for those waiting
        self._failures = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._controls: dict[str, Control] = {}  # by fork server: "main", "trial"
        self._control_lock = threading.Lock()  # guards _controls
        self._cgroup_dirs: dict[str, str] = {}
        self._uid_base = 1_000_000 + secrets.randbelow(60_000) * UID_SLOTS  # not `random`: the host's RNG is not ours
        self._slots = 0

    async def take(self) -> Box:
        """An idle sandbox, or the next one the refill makes."""
        if self._closed:
            raise SandboxUnavailableError("this sandbox client was torn down")
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._refill, name="ptenv-sandbox-pool", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            box = self._pop_live()
        return box if box is not None else await asyncio.to_thread(self._wait_for_box)

    async def take_trial(self) -> Box:
        """A fresh sandbox from the trial zygote, with no session: a level-2 trial runs there."""
        if self._closed:
            raise SandboxUnavailableError("this sandbox client was torn down")
        return await asyncio.to_thread(self._spawn, "trial")

    def kill(self, boxes: list[Box]) -> None:
        """Have each box's fork server SIGKILL its supervisor (and so its pid namespace); it reaps them later."""
        for server in {b.server for b in boxes}:
            try:
                self._control_call({"op": "kill", "sandboxes": [[b.pid, b.uid] for b in boxes if b.server == server]},
                                   server=server)
            except ControlError:
                pass  # the fork server is gone or is being replaced, and its sandboxes with it

    def close(self) -> None:
        """Kill the fork server and with it every sandbox, and remove this client's cgroups."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._stop_forkserver()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._cond:  # idle sandboxes: their supervisors died with the fork server
            while self._idle:
                self._idle.popleft().sock.close()
        if self._cgroup_dirs:  # empty once the sandboxes' last processes have exited
            deadline = time.monotonic() + 5
            while any(map(os.path.exists, self._cgroup_dirs.values())) and time.monotonic() < deadline:
                cgroups.remove_client_dirs(self._cgroup_dirs)
                time.sleep(0.05)

    def _pop_live(self) -> Box | None:
        """An idle sandbox that is still alive (one whose fork server died is dropped); holds _cond."""
        while self._idle:
            box = self._idle.popleft()
            self._cond.notify_all()
            if box.is_alive():
                return box
            box.sock.close()
        return None

    def _wait_for_box(self) -> Box:
        """Wait for the refill; a failure of it while we wait fails this create only."""
        deadline = time.monotonic() + START_TIMEOUT + CONTROL_TIMEOUT
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            seen = self._failures
            try:
                while True:
                    box = self._pop_live()
                    if box is not None:
                        return box
                    if self._failures != seen:
                        raise self._failure
                    if self._closed:
                        raise SandboxUnavailableError("this sandbox client was torn down")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SandboxUnavailableError(f"no sandbox became ready within {START_TIMEOUT + CONTROL_TIMEOUT:g} s")
                    self._cond.wait(left)
            finally:
                self._waiting -= 1

    def _refill(self) -> None:
        """Background thread: keeps `size` idle sandboxes ready, plus one per waiting create.

        It also owns the fork server process, whose bwrap dies with the thread that started it,
        and replaces it when it dies or stops answering."""
        backoff, replaced = BACKOFF[0], False
        while True:
            with self._cond:
                while not self._closed and len(self._idle) >= self.size + self._waiting:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                if self.forkserver is None or self.forkserver.poll() is not None:
                    self._start_forkserver()
                box = self._spawn()
            except Exception as e:
                if isinstance(e, ControlError):
                    self._stop_forkserver()
                    if not replaced:  # a fork server that died: start another at once, unseen by waiters
                        replaced = True
                        continue
                with self._cond:
                    self._failure = e if isinstance(e, SandboxUnavailableError) else SandboxUnavailableError(one_line(e))
                    self._failures += 1
                    self._cond.notify_all()
                    self._cond.wait(backoff)  # teardown wakes us
                backoff = min(backoff * 2, BACKOFF[1])
                continue
            backoff, replaced = BACKOFF[0], False
            with self._cond:
                self._idle.append(box)
                self._cond.notify_all()

    def _start_forkserver(self) -> None:
        self._stop_forkserver()  # a dead or wedged one, and its control socket
        dir_fds = self._open_cgroup_dirs()
        servers = ["main"] + (["trial"] if self.allowlist_base is not None else [])
        ends = {server: socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for server in servers}
        python = os.path.realpath(sys.executable)  # inside, no venv: site-packages come via PYTHONPATH
        argv = [python, "-S", "-P", "-m", "ptenv.inside.main", "forkserver",
                json.dumps({server: forkserver_end.fileno() for server, (_, forkserver_end) in ends.items()}),
                json.dumps(dir_fds), "root" if os.geteuid() == 0 else "rootless", json.dumps(self.allowlist_base)]
        try:
            self.forkserver = subprocess.Popen(
                sandbox_command(argv, privileged=True),
                pass_fds=[forkserver_end.fileno() for _, forkserver_end in ends.values()] + [*dir_fds.values()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C reaches the host only; teardown kills the group
            )
        finally:
            for _, forkserver_end in ends.values():
                forkserver_end.close()
            for fd in dir_fds.values():
                os.close(fd)
        # One deadline for both: the trial zygote says it is ready after the fork server has imported
        # torch and it has installed its allowlist, so each waits at most START_TIMEOUT from here.
        deadline = time.monotonic() + START_TIMEOUT
        ready = all(self._ready(host_end, deadline) for host_end, _ in ends.values())
        if not ready:
            for host_end, _ in ends.values():
                host_end.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.forkserver.pid, signal.SIGKILL)
            _, err = self.forkserver.communicate(timeout=10)
            lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
            reason = lines[-1].strip() if lines else f"it exited with code {self.forkserver.returncode}"
            raise SandboxUnavailableError(
                f"cannot start the sandbox fork server: {reason}. Linux namespaces are blocked: run the container "
                "with --security-opt seccomp=unconfined --cap-add SYS_ADMIN,NET_ADMIN,SYS_PTRACE (podman; "
                "--security-opt unmask=/sys/fs/cgroup adds cgroups) or in a pod that allows them, or use sandbox=\"prime\"; "
                f"{NO_FALLBACK}"
            )
        self.forkserver.stderr.close()
        with self._control_lock:
            self._controls = {server: Control(host_end) for server, (host_end, _) in ends.items()}

    @staticmethod
    def _ready(host_end: socket.socket, deadline: float) -> bool:
        """Whether a fork server (or the trial zygote) said it is ready by `deadline` (monotonic)."""
        host_end.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            return bool(host_end.recv(65536))
        except TimeoutError:
            return False

    def _open_cgroup_dirs(self) -> dict[str, int]:
        """Directory fds of this client's cgroups for the fork server; {} where none can be had,
        and then each sandbox denies the memory that only a cgroup could count (seccomp.py)."""
        if not self._cgroup_dirs:
            try:
                self._cgroup_dirs = cgroups.make_client_dirs(f"ptenv-{os.getpid()}-{uuid.uuid4().hex[:8]}")
                self.cgroup_mode = cgroups.describe(self._cgroup_dirs)
            except cgroups.Unavailable as e:
                self.cgroup_mode = f"no cgroup ({e}): {NO_CGROUP}"
        return {c: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for c, path in self._cgroup_dirs.items()}

    def _stop_forkserver(self) -> None:
        """Kill the fork server; bwrap's --die-with-parent chain takes every sandbox with it."""
        with self._control_lock:
            for control in self._controls.values():
                control.sock.close()
            self._controls = {}
        if self.forkserver is not None and self.forkserver.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.forkserver.pid, signal.SIGKILL)
            self.forkserver.wait()

    def _control_call(self, request: dict, fds: list[int] = (), server: str = "main") -> dict:
        """One request to a fork server and its reply; ControlError if it fails."""
        with self._control_lock:
            control = self._controls.get(server)
        if control is None:
            raise ControlError(f"the sandbox fork server ({server}) is not running")
        return control.call(request, fds)

    def _spawn(self, server: str = "main") -> Box:
        host_end, sandbox_end = socket.socketpair()
        with self._cond:  # the refill thread and trials' spawns take uids at once
            uid = self._uid_base + 2 * (self._slots % (UID_SLOTS // 2))
            self._slots += 1
        request = {"op": "spawn", "uids": [uid, uid + 1], "limits": self.limits.as_dict()}
        try:
            with sandbox_end:
                reply = self._control_call(request, [sandbox_end.fileno()], server)
            if "error" not in reply:
                frame = recv_frame(host_end, 4096, time.monotonic() + CONTROL_TIMEOUT)
                reply |= json.loads(frame) if frame else {"error": "its supervisor exited while starting"}
            if "error" in reply:
                raise SandboxUnavailableError(f"{reply['error']}; {NO_FALLBACK}")
        except BaseException:
            host_end.close()
            raise
        host_end.setblocking(False)
        return Box(id=f"local-{uuid.uuid4().hex[:16]}", pid=reply["pid"], uid=uid, sock=host_end, server=server)


class Control:
    """The host's end of one fork server's control socket: requests and replies matched by id."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.ids = itertools.count()

    def call(self, request: dict, fds: list[int]) -> dict:
        request = {**request, "id": next(self.ids)}
        with self.lock:
            deadline = time.monotonic() + CONTROL_TIMEOUT
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
                while True:
                    self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                    msg = self.sock.recv(65536)
                    if not msg:
                        raise ControlError("the sandbox fork server exited")
                    reply = json.loads(msg)
                    if reply.get("id") == request["id"]:
                        return reply
            except (OSError, ValueError) as e:  # TimeoutError is an OSError
                raise ControlError(f"the sandbox fork server failed: {one_line(e)}") from None
