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
import errno
import itertools
import json
import os
import resource
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
STALLED = START_TIMEOUT + CONTROL_TIMEOUT  # a create fails when no sandbox became ready for this long
UID_SLOTS = 1 << 16  # each client takes a random block of uids; two per sandbox, never reused early
BACKOFF = (0.1, 5.0)  # seconds between refill attempts after a failure: first, and at most
# Sandboxes forked whose supervisors are still isolating: a burst's sandboxes start side by side
# (each supervisor's set-up, its interpreter's cgroup attach among it, waits on the kernel).
SPAWN_AHEAD = 16


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


@dataclass
class Starting:
    """A sandbox the fork server forked, whose supervisor has not yet said it is ready."""

    sock: socket.socket
    pid: int
    uid: int
    server: str  # the fork server that forked it: "main" or "trial"


class Pool:
    def __init__(self, limits: Limits, size: int, allowlist_base: list[str] | None):
        self.limits = limits
        # The widest allowlist of any trial: the trial zygote installs it once (inside/main.py), so a
        # trial's sandbox made there only adds its family's removals. None: no trial zygote.
        self.allowlist_base = allowlist_base
        self.cgroup_mode = "not started"  # what the kernel enforces per sandbox, once the fork server runs
        self.forkserver: subprocess.Popen | None = None
        # Idle sandboxes kept ready, by fork server: none of the trial zygote's (a trial's sandbox is
        # made when a trial asks for it), `size` of the main one's. Trials' first: a rollout waits
        # for its score there.
        self._keep = ({"trial": 0} if allowlist_base is not None else {}) | {"main": size}
        self._idle = {server: collections.deque() for server in self._keep}  # guarded by _cond
        self._cond = threading.Condition()
        # Creates and trials waiting for the refill, as futures of their event loops: a burst of a
        # thousand waits without a thread each. By fork server; guarded by _cond.
        self._waiters: dict[str, collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {
            server: collections.deque() for server in self._keep}
        self._closed = False
        self._made = time.monotonic()  # when the refill last made a sandbox ready
        self._thread: threading.Thread | None = None
        self._controls: dict[str, Control] = {}  # by fork server: "main", "trial"
        self._control_lock = threading.Lock()  # guards _controls
        self._cgroup_dirs: dict[str, str] = {}
        self._uid_base = 1_000_000 + secrets.randbelow(60_000) * UID_SLOTS  # not `random`: the host's RNG is not ours
        self._slots = 0

    async def take(self) -> Box:
        """An idle sandbox, or the next one the refill makes; a failure of the refill while this
        waits fails it (and the others waiting then), not the creates after it."""
        return await self._take("main")

    async def take_trial(self) -> Box:
        """A fresh sandbox of the trial zygote, with no session, for a level-2 trial: made by the
        refill as a create's is (side by side in a burst, waited for as a future)."""
        if "trial" not in self._keep:
            raise SandboxUnavailableError("this sandbox client has no trial zygote (no allowlist base)")
        return await self._take("trial")

    async def _take(self, server: str) -> Box:
        if self._closed:
            raise SandboxUnavailableError("this sandbox client was torn down")
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._refill, name="ptenv-sandbox-pool", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            box = self._pop_live(server)
            if box is not None:
                return box
            self._waiters[server].append((loop, waiter))
            self._cond.notify_all()
        try:
            return await self._wait(waiter)
        except BaseException:  # failed, or cancelled: a sandbox handed over meanwhile goes back
            with self._cond:
                if (loop, waiter) in self._waiters[server]:
                    self._waiters[server].remove((loop, waiter))
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())
            waiter.cancel()
            raise

    async def _wait(self, waiter: asyncio.Future) -> Box:
        """The waiter's sandbox. A burst of a thousand waits as long as the refill makes sandboxes;
        it fails once none became ready for STALLED seconds (a wedged fork server is replaced sooner)."""
        since = time.monotonic()
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), STALLED)
            except TimeoutError:
                if time.monotonic() - max(self._made, since) >= STALLED:
                    raise SandboxUnavailableError(f"no sandbox became ready within {STALLED:g} s") from None

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
            self._fail_waiters(SandboxUnavailableError("this sandbox client was torn down"))
            self._cond.notify_all()
        self._stop_forkserver()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._cond:  # idle sandboxes: their supervisors died with the fork server
            for idle in self._idle.values():
                while idle:
                    idle.popleft().sock.close()
        if self._cgroup_dirs:  # empty once the sandboxes' last processes have exited
            deadline = time.monotonic() + 5
            while any(map(os.path.exists, self._cgroup_dirs.values())) and time.monotonic() < deadline:
                cgroups.remove_client_dirs(self._cgroup_dirs)
                time.sleep(0.05)

    def _pop_live(self, server: str) -> Box | None:
        """An idle sandbox of that fork server that is still alive (one whose fork server died is
        dropped); holds _cond."""
        idle = self._idle[server]
        while idle:
            box = idle.popleft()
            self._cond.notify_all()
            if box.is_alive():
                return box
            box.sock.close()
        return None

    def _refill(self) -> None:
        """Background thread: keeps `size` idle sandboxes ready, plus one per waiting create, and
        one of the trial zygote per waiting trial.

        It also owns the fork server process, whose bwrap dies with the thread that started it,
        and replaces it when it dies or stops answering."""
        backoff, replaced = BACKOFF[0], False
        starting: collections.deque[Starting] = collections.deque()
        while True:
            with self._cond:
                while not self._closed and not starting and all(self._wanted(server) <= 0 for server in self._keep):
                    self._cond.wait()
                if self._closed:
                    close_all(starting)
                    return
            try:
                if self.forkserver is None or self.forkserver.poll() is not None:
                    self._start_forkserver()
                box = self._next_box(starting)
            except Exception as e:
                close_all(starting)  # their supervisors exit at the end of their channel
                if isinstance(e, ControlError):
                    self._stop_forkserver()
                    if not replaced:  # a fork server that died: start another at once, unseen by waiters
                        replaced = True
                        continue
                with self._cond:
                    self._fail_waiters(e if isinstance(e, SandboxUnavailableError) else SandboxUnavailableError(one_line(e)))
                    self._cond.wait(backoff)  # teardown wakes us
                backoff = min(backoff * 2, BACKOFF[1])
                continue
            backoff, replaced = BACKOFF[0], False
            with self._cond:
                self._made = time.monotonic()
                self._idle[box.server].append(box)
                self._hand_out(box.server)
                self._cond.notify_all()

    def _hand_out(self, server: str) -> None:
        """Give that fork server's idle sandboxes to those waiting for one, each in its own event
        loop; holds _cond."""
        waiters = self._waiters[server]
        while waiters and self._idle[server]:
            loop, waiter = waiters.popleft()
            box = self._pop_live(server)
            if box is None:
                waiters.appendleft((loop, waiter))
                return
            try:
                loop.call_soon_threadsafe(self._give, waiter, box)
            except RuntimeError:  # its loop is closed
                self._idle[server].appendleft(box)

    def _give(self, waiter: asyncio.Future, box: Box) -> None:
        """In the waiter's event loop: hand it the sandbox, or back to the pool if it stopped waiting."""
        if not waiter.done():
            waiter.set_result(box)
        else:
            self._give_back(box)

    def _give_back(self, box: Box) -> None:
        with self._cond:
            self._idle[box.server].appendleft(box)
            self._hand_out(box.server)
            self._cond.notify_all()

    def _fail_waiters(self, error: Exception) -> None:
        """Fail every create and trial waiting now; holds _cond."""
        for waiters in self._waiters.values():
            while waiters:
                loop, waiter = waiters.popleft()
                with contextlib.suppress(RuntimeError):  # its loop is closed
                    loop.call_soon_threadsafe(fail_unless_done, waiter, error)

    def _wanted(self, server: str) -> int:
        """That fork server's sandboxes to make beyond its idle ones: those it keeps, and one per
        create or trial waiting; holds _cond."""
        return self._keep[server] + len(self._waiters[server]) - len(self._idle[server])

    def _next_box(self, starting: collections.deque[Starting]) -> Box:
        """The next sandbox ready: first fork as many as are wanted (trials' first), up to
        SPAWN_AHEAD at once, so that their supervisors start side by side; then wait for the oldest
        one's first word. One too slow to say it (a machine overloaded) is killed and the next one
        awaited: those waiting fail only when none becomes ready for STALLED seconds (_wait)."""
        while True:
            with self._cond:
                wanted = {server: self._wanted(server) - sum(s.server == server for s in starting) for server in self._keep}
            for server, more in wanted.items():
                for _ in range(max(min(more, SPAWN_AHEAD - len(starting)), 0)):
                    starting.append(self._fork_sandbox(server))
            if not starting:  # what was wanted was taken meanwhile: one spare for the pool
                starting.append(self._fork_sandbox("main"))
            oldest = starting.popleft()
            try:
                return self._ready(oldest)
            except TimeoutError:
                self._control_call({"op": "kill", "sandboxes": [[oldest.pid, oldest.uid]]}, server=oldest.server)

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
        ready = all(said_ready(host_end, deadline) for host_end, _ in ends.values())
        if not ready:
            for host_end, _ in ends.values():
                host_end.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.forkserver.pid, signal.SIGKILL)
            _, err = self.forkserver.communicate(timeout=10)
            lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
            reason = lines[-1].strip() if lines else f"it exited with code {self.forkserver.returncode}"
            raise SandboxUnavailableError(
                # within one_line's 300 characters, behind bwrap's own line and the rollout's prefix
                # (`--security-opt unmask=/sys/fs/cgroup` for cgroups: docs/sandbox.md)
                f"cannot start the sandbox fork server: {reason}. The namespaces are blocked: use sandbox=\"prime\", "
                "a pod that allows them, or --security-opt seccomp=unconfined --cap-add SYS_ADMIN,NET_ADMIN,SYS_PTRACE; "
                f"{NO_FALLBACK}"
            )
        self.forkserver.stderr.close()
        with self._control_lock:
            self._controls = {server: Control(host_end) for server, (host_end, _) in ends.items()}

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

    def _fork_sandbox(self, server: str) -> Starting:
        """Have a fork server fork a sandbox; its supervisor then isolates itself, on its own."""
        host_end, sandbox_end = channel_pair()
        uid = self._uid_base + 2 * (self._slots % (UID_SLOTS // 2))
        self._slots += 1
        request = {"op": "spawn", "uids": [uid, uid + 1], "limits": self.limits.as_dict()}
        try:
            with sandbox_end:
                reply = self._control_call(request, [sandbox_end.fileno()], server)
            if "error" in reply:
                raise SandboxUnavailableError(f"{reply['error']}; {NO_FALLBACK}")
        except BaseException:
            host_end.close()
            raise
        return Starting(host_end, reply["pid"], uid, server)

    def _ready(self, starting: Starting) -> Box:
        """The sandbox, once its supervisor says it is ready; SandboxUnavailableError if it could not
        isolate, TimeoutError if it did not say within CONTROL_TIMEOUT."""
        try:
            frame = recv_frame(starting.sock, 4096, time.monotonic() + CONTROL_TIMEOUT)
            if frame is None and self.forkserver.poll() is not None:
                raise ControlError("the sandbox fork server exited")  # and its sandboxes with it: it is replaced
            reply = json.loads(frame) if frame else {"error": "its supervisor exited while starting"}
            if "error" in reply:
                raise SandboxUnavailableError(f"{reply['error']}; {NO_FALLBACK}")
        except BaseException:
            starting.sock.close()
            raise
        starting.sock.setblocking(False)
        return Box(id=f"local-{uuid.uuid4().hex[:16]}", pid=starting.pid, uid=starting.uid, sock=starting.sock,
                   server=starting.server)


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


def said_ready(host_end: socket.socket, deadline: float) -> bool:
    """Whether a fork server (or the trial zygote) said it is ready by `deadline` (monotonic)."""
    host_end.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        return bool(host_end.recv(65536))
    except TimeoutError:
        return False


def fail_unless_done(waiter: asyncio.Future, error: Exception) -> None:
    if not waiter.done():
        waiter.set_exception(error)


def close_all(starting: collections.deque[Starting]) -> None:
    while starting:
        starting.popleft().sock.close()


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """A sandbox's channel; a host out of file descriptors says so in one line."""
    try:
        return socket.socketpair()
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        raise SandboxUnavailableError(f"the host process is out of file descriptors (its limit is {limit}): keep "
                                      "fewer rollouts in flight, or raise the limit (`ulimit -Hn`)") from None
