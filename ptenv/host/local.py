"""Local sandbox transport: the calls verifiers' SandboxEnv makes on prime_sandboxes' async client
(create, wait_for_creation, execute_command, delete, bulk_delete, teardown), answered by sandboxes
on this machine, isolated with bubblewrap, Linux namespaces, cgroups and seccomp (the process tree
is in forkserver.py).

The first `create` starts a fork server that imports torch once; a few idle sandboxes are kept
forked ahead, so `create` is a pool pop and the first cell answers in milliseconds. The pool heals:
a fork server that dies or stops answering is replaced, and a failed refill is retried with
backoff; each failure costs only the rollouts that were waiting on it.
"""

import asyncio
import atexit
import collections
import contextlib
import importlib.metadata
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from prime_sandboxes import (
    BulkDeleteSandboxResponse,
    CommandResponse,
    CommandTimeoutError,
    Sandbox,
    SandboxNotRunningError,
)

from ptenv.inside import cgroups
from ptenv import inside
from ptenv.inside.protocol import FRAME, REPLY_KEYS, Limits, one_line, recv_frame, recv_frame_async

START_TIMEOUT = 60.0  # fork server start (imports torch)
CONTROL_TIMEOUT = 30.0  # for the fork server's answer to one request, and a supervisor's first word
HOST_MARGIN = 5.0  # past a command's own deadline, the supervisor itself is considered hung
DEFAULT_TIMEOUT = 300.0  # prime_sandboxes' default per command
UID_SLOTS = 1 << 16  # each client takes a random block of uids; two per sandbox, never reused early
BACKOFF = (0.1, 5.0)  # seconds between refill attempts after a failure: first, and at most
PTENV_ROOT = "/opt/ptenv"
SITE_PACKAGES = "/opt/site-packages"
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/hosts",
)
NO_FALLBACK = "nothing runs unsandboxed"
NO_CGROUP = "memory polled, memfd and SysV shared memory denied, CPU shared by autogroup"  # seccomp.py


class SandboxUnavailableError(RuntimeError):
    """No sandbox could be made: this machine cannot isolate one (no bubblewrap, no namespaces,
    not root), or the fork server failed."""


class ControlError(SandboxUnavailableError):
    """The fork server died or stopped answering: it is replaced."""


def sandbox_command(argv: list[str], privileged: bool = False) -> list[str]:
    """`bwrap ... -- argv`: the filesystem and namespaces every sandbox process lives in.

    Visible, read-only: /usr (and the /bin, /lib... links into it), a few /etc files, the Python
    installation, the venv's site-packages (with this project's own installed files masked) and
    the files of ptenv/inside (inside.FILES). Nothing of the repo, /work, /root or the Hugging Face cache.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(
            f"bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap`; {NO_FALLBACK}"
        )
    prefix = sys.base_prefix
    env = {
        "PATH": f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",  # getpass.getuser() needs a name; the sandbox uid has no passwd entry
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "PYTHONPATH": f"{PTENV_ROOT}:{SITE_PACKAGES}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": "1",
        # Each thread would otherwise reserve a 64 MiB malloc arena of the sandbox's address space.
        "MALLOC_ARENA_MAX": "2",
    }
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    args += ["--die-with-parent", "--new-session", "--clearenv"]
    if os.geteuid() != 0:  # rootless: uid 0 of a user namespace of our own, mapped to our uid
        args += ["--unshare-user", "--uid", "0", "--gid", "0"]
    if privileged:  # the fork server needs root's capabilities (in that namespace) to build sandboxes
        args += ["--cap-add", "ALL"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    binds = [("/usr", "/usr")]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged /usr (Debian): these are links into /usr
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            binds.append((top, top))
    binds += [(path, path) for path in ETC_FILES if os.path.exists(path)]
    if not prefix.startswith("/usr/"):
        binds.append((prefix, prefix))
    site = sysconfig.get_paths()["purelib"]
    binds.append((site, SITE_PACKAGES))
    binds += [(str(inside.SOURCE_ROOT / rel), f"{PTENV_ROOT}/{rel}") for rel in inside.FILES]
    made = {"/", "/tmp", "/dev", "/proc"}
    for src, dest in binds:
        # bwrap would create missing parents 0700, unreadable for the sandbox's uid.
        for parent in reversed(Path(dest).parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", src, dest]
    for path in installed_project_files():
        for visible_root, host_root in ((SITE_PACKAGES, site), (prefix, prefix)):
            if path.is_relative_to(host_root) and path.is_file():
                args += ["--ro-bind", "/dev/null", str(visible_root / path.relative_to(host_root))]
                break
    # Read-only: rootless, they belong to the sandbox's uid, and every sandbox of the fork server sees them.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return args + ["--chdir", "/tmp", "--", *argv]


def isolation_mode() -> str:
    """How this process's sandboxes will be isolated (README, "The sandbox"), in one line."""
    reason = cgroups.unavailable()
    if os.geteuid() == 0:
        who = "root: two host uids per sandbox"
    else:
        who = "rootless: one user namespace per sandbox, the user's uid for all"
    if reason is None:
        return f"{who}; cgroup v1 memory, pids and cpu per sandbox"
    return f"{who}; no cgroup ({reason}): {NO_CGROUP}"


def installed_project_files() -> list[Path]:
    """This project's files in an installation (a wheel puts the task catalogue and train.jsonl there)."""
    try:
        dist = importlib.metadata.distribution("pytorch-env")
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(dist.locate_file(f)).resolve() for f in dist.files or []]


@dataclass
class _Box:
    id: str
    pid: int  # of its supervisor, as the fork server sees it
    uid: int  # of its supervisor; the model's is uid + 1
    sock: socket.socket
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


class LocalSandboxClient:
    """prime_sandboxes.AsyncSandboxClient's interface, as SandboxEnv uses it, on local sandboxes."""

    pool_size = 4  # idle sandboxes kept ready

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.cgroup_mode = "not started"  # what the kernel enforces per sandbox, once the fork server runs
        self.isolation_mode = isolation_mode()
        self._boxes: dict[str, _Box] = {}
        self._pool: collections.deque[_Box] = collections.deque()  # idle sandboxes; guarded by _cond
        self._cond = threading.Condition()
        self._waiting = 0
        self._failure: Exception | None = None  # the refill's latest failure, for those waiting
        self._failures = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._forkserver: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._control_lock = threading.Lock()
        self._request_ids = itertools.count()
        self._cgroup_dirs: dict[str, str] = {}
        self._uid_base = 1_000_000 + secrets.randbelow(60_000) * UID_SLOTS  # not `random`: the host's RNG is not ours
        self._slots = 0

    # -- the SandboxEnv surface

    async def create(self, request) -> Sandbox:
        """A ready sandbox; `request` is a prime_sandboxes.CreateSandboxRequest (its Docker fields do not apply)."""
        if self._closed:
            raise SandboxUnavailableError("this sandbox client was torn down")
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._refill, name="ptenv-sandbox-pool", daemon=True)
                self._thread.start()
                atexit.register(self.teardown)
            box = self._pop_live()
        if box is None:
            box = await asyncio.to_thread(self._wait_for_box)
        self._boxes[box.id] = box
        now = datetime.now(timezone.utc)
        return Sandbox(
            id=box.id,
            name=request.name,
            docker_image=request.docker_image or "local",
            cpu_cores=1,
            memory_gb=self.limits.memory_mb / 1024,
            disk_size_gb=self.limits.scratch_mb / 1024,
            disk_mount_path="/tmp",
            gpu_count=0,
            status="RUNNING",
            timeout_minutes=request.timeout_minutes,
            labels=request.labels,
            created_at=now,
            updated_at=now,
        )

    async def wait_for_creation(self, sandbox_id: str) -> None:
        self._live_box(sandbox_id)

    async def execute_command(
        self, sandbox_id: str, command: str, working_dir: str | None = None, timeout: float | None = None
    ) -> CommandResponse:
        """Run `command` with /bin/sh in the sandbox, as the model: only ever a shell command (the
        harness's own requests are typed, see `call`).

        Raises CommandTimeoutError when a shell command runs past `timeout` (its process group is
        killed), SandboxNotRunningError for an unknown, deleted or broken sandbox."""
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        reply = await self._request(sandbox_id, {"op": "sh", "command": command, "cwd": working_dir}, timeout)
        if reply.get("timed_out") is True:
            raise CommandTimeoutError(sandbox_id, one_line(command, 80), timeout)
        try:
            return CommandResponse(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"])
        except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
            box = self._boxes[sandbox_id]
            self._stop(box, "it sent a malformed reply")
            raise not_running(box) from None

    async def call(self, sandbox_id: str, op: str, fields: dict, timeout: float) -> dict:
        """The harness's own request `op` (exec, preload, result, hidden: see ptenv.inside.supervisor) and
        its reply document, on a channel the model's commands never reach."""
        reply = await self._request(sandbox_id, {"op": op, **fields}, timeout)
        doc = reply.get(REPLY_KEYS.get(op, "cell"))
        if not isinstance(doc, dict):
            box = self._boxes[sandbox_id]
            self._stop(box, "it sent a malformed reply")
            raise not_running(box)
        return doc

    async def _request(self, sandbox_id: str, request: dict, timeout: float) -> dict:
        box = self._live_box(sandbox_id)
        reply = await self._roundtrip(box, {**request, "timeout": timeout}, timeout + self.limits.grace + HOST_MARGIN)
        if "error" in reply:  # the supervisor could not serve the request: the harness failed
            self._stop(box, one_line(reply["error"]))
            raise not_running(box)
        return reply

    async def delete(self, sandbox_id: str) -> dict:
        """Kill the sandbox and everything in it. An unknown id counts as already deleted, so a
        retried delete (SandboxEnv retries) succeeds."""
        await self._delete([self._boxes[sandbox_id]] if sandbox_id in self._boxes else [])
        return {"success": True, "id": sandbox_id}

    async def bulk_delete(self, sandbox_ids: list[str]) -> BulkDeleteSandboxResponse:
        await self._delete([self._boxes[i] for i in sandbox_ids if i in self._boxes])
        return BulkDeleteSandboxResponse(
            succeeded=list(sandbox_ids), failed=[], message=f"deleted {len(sandbox_ids)} sandboxes"
        )

    def teardown(self) -> None:
        """Kill the fork server and with it every sandbox (synchronous: SandboxEnv does not await it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._stop_forkserver()
        for box in list(self._boxes.values()):
            self._stop(box, "the sandbox client was torn down")
            box.sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._cond:  # idle sandboxes: their supervisors died with the fork server
            while self._pool:
                self._pool.popleft().sock.close()
        if self._cgroup_dirs:  # empty once the sandboxes' last processes have exited
            deadline = time.monotonic() + 5
            while any(map(os.path.exists, self._cgroup_dirs.values())) and time.monotonic() < deadline:
                cgroups.remove_client_dirs(self._cgroup_dirs)
                time.sleep(0.05)

    # -- sandboxes

    def _live_box(self, sandbox_id: str) -> _Box:
        box = self._boxes.get(sandbox_id)
        if box is None:
            raise SandboxNotRunningError(sandbox_id, message=f"sandbox {sandbox_id} does not exist or was deleted")
        if box.dead:
            raise not_running(box)
        return box

    async def _roundtrip(self, box: _Box, request: dict, wait: float) -> dict:
        loop = asyncio.get_running_loop()
        async with box.lock:
            if box.dead:
                raise not_running(box)
            request = {**request, "id": next(box.requests)}
            payload = json.dumps(request).encode()
            try:
                async with asyncio.timeout(wait):
                    await loop.sock_sendall(box.sock, FRAME.pack(len(payload)) + payload)
                    frame = await recv_frame_async(loop, box.sock)
            except TimeoutError:
                self._stop(box, f"it did not answer within {wait:g} s")
                raise CommandTimeoutError(box.id, one_line(request.get("command", request["op"]), 80), request["timeout"]) from None
            except (OSError, ValueError) as e:
                self._stop(box, f"its channel failed ({one_line(e)})")
                raise not_running(box) from None
            except BaseException:  # cancelled mid-command: the reply would come out of step
                self._stop(box, "a command was interrupted")
                raise
            if frame is None:
                self._stop(box, "its supervisor exited")
                raise not_running(box)
            try:
                reply = json.loads(frame)
            except ValueError:
                reply = None
            if not isinstance(reply, dict) or reply.get("id") != request["id"]:
                self._stop(box, "it sent a malformed reply")
                raise not_running(box)
            return reply

    def _stop(self, box: _Box, reason: str) -> None:
        """Mark a sandbox dead and cut its channel: its supervisor exits on end of stream."""
        if box.dead is None:
            box.dead = reason
        try:
            box.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    async def _delete(self, boxes: list[_Box]) -> None:
        if not boxes:
            return
        for box in boxes:
            self._stop(box, "it was deleted")
        await asyncio.to_thread(self._kill, boxes)
        for box in boxes:
            async with box.lock:  # a command in flight has ended: its supervisor is gone
                box.sock.close()
            self._boxes.pop(box.id, None)

    def _kill(self, boxes: list[_Box]) -> None:
        """Have the fork server SIGKILL each supervisor (and so its pid namespace); it reaps them later."""
        try:
            self._control_call({"op": "kill", "sandboxes": [[b.pid, b.uid] for b in boxes]})
        except ControlError:
            pass  # the fork server is gone or is being replaced, and its sandboxes with it

    # -- the pool and the fork server

    def _pop_live(self) -> _Box | None:
        """An idle sandbox that is still alive (one whose fork server died is dropped); holds _cond."""
        while self._pool:
            box = self._pool.popleft()
            self._cond.notify_all()
            if box.is_alive():
                return box
            box.sock.close()
        return None

    def _wait_for_box(self) -> _Box:
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
        """Background thread: keeps pool_size idle sandboxes ready, plus one per waiting create.

        It also owns the fork server process, whose bwrap dies with the thread that started it,
        and replaces it when it dies or stops answering."""
        backoff, replaced = BACKOFF[0], False
        while True:
            with self._cond:
                while not self._closed and len(self._pool) >= self.pool_size + self._waiting:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                if self._forkserver is None or self._forkserver.poll() is not None:
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
                self._pool.append(box)
                self._cond.notify_all()

    def _start_forkserver(self) -> None:
        self._stop_forkserver()  # a dead or wedged one, and its control socket
        dir_fds = self._open_cgroup_dirs()
        host_end, forkserver_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        python = os.path.realpath(sys.executable)  # inside, no venv: site-packages come via PYTHONPATH
        argv = [python, "-S", "-P", "-m", "ptenv.inside.main", "forkserver", str(forkserver_end.fileno()),
                json.dumps(dir_fds), "root" if os.geteuid() == 0 else "rootless"]
        try:
            self._forkserver = subprocess.Popen(
                sandbox_command(argv, privileged=True),
                pass_fds=[forkserver_end.fileno(), *dir_fds.values()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C reaches the host only; teardown kills the group
            )
        finally:
            forkserver_end.close()
            for fd in dir_fds.values():
                os.close(fd)
        host_end.settimeout(START_TIMEOUT)
        try:
            ready = host_end.recv(65536)
        except TimeoutError:
            ready = b""
        if not ready:
            host_end.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._forkserver.pid, signal.SIGKILL)
            _, err = self._forkserver.communicate(timeout=10)
            lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
            reason = lines[-1].strip() if lines else f"it exited with code {self._forkserver.returncode}"
            raise SandboxUnavailableError(
                f"cannot start the sandbox fork server: {reason}. Linux namespaces are blocked: run the container "
                "with --security-opt seccomp=unconfined or in a pod that allows them, or use sandbox=\"prime\"; "
                f"{NO_FALLBACK}"
            )
        self._forkserver.stderr.close()
        with self._control_lock:
            self._control = host_end

    def _open_cgroup_dirs(self) -> dict[str, int]:
        """Directory fds of this client's cgroups for the fork server; {} where none can be had,
        and then each sandbox denies the memory that only a cgroup could count (seccomp.py)."""
        if not self._cgroup_dirs:
            try:
                self._cgroup_dirs = cgroups.make_client_dirs(f"ptenv-{os.getpid()}-{uuid.uuid4().hex[:8]}")
                self.cgroup_mode = "cgroup v1: memory (shared memory included), pids and cpu per sandbox"
            except cgroups.Unavailable as e:
                self.cgroup_mode = f"no cgroup ({e}): {NO_CGROUP}"
        return {c: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for c, path in self._cgroup_dirs.items()}

    def _stop_forkserver(self) -> None:
        """Kill the fork server; bwrap's --die-with-parent chain takes every sandbox with it."""
        with self._control_lock:
            if self._control is not None:
                self._control.close()
                self._control = None
        if self._forkserver is not None and self._forkserver.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._forkserver.pid, signal.SIGKILL)
            self._forkserver.wait()

    def _control_call(self, request: dict, fds: list[int] = ()) -> dict:
        """One request to the fork server and its reply, matched by id; ControlError if it fails."""
        request = {**request, "id": next(self._request_ids)}
        with self._control_lock:
            if self._control is None:
                raise ControlError("the sandbox fork server is not running")
            deadline = time.monotonic() + CONTROL_TIMEOUT
            try:
                socket.send_fds(self._control, [json.dumps(request).encode()], list(fds))
                while True:
                    self._control.settimeout(max(deadline - time.monotonic(), 0.001))
                    msg = self._control.recv(65536)
                    if not msg:
                        raise ControlError("the sandbox fork server exited")
                    reply = json.loads(msg)
                    if reply.get("id") == request["id"]:
                        return reply
            except (OSError, ValueError) as e:  # TimeoutError is an OSError
                raise ControlError(f"the sandbox fork server failed: {one_line(e)}") from None

    def _spawn(self) -> _Box:
        host_end, sandbox_end = socket.socketpair()
        uid = self._uid_base + 2 * (self._slots % (UID_SLOTS // 2))
        self._slots += 1
        request = {"op": "spawn", "uids": [uid, uid + 1], "limits": self.limits.as_dict()}
        try:
            with sandbox_end:
                reply = self._control_call(request, [sandbox_end.fileno()])
            if "error" not in reply:
                frame = recv_frame(host_end, 4096, time.monotonic() + CONTROL_TIMEOUT)
                reply |= json.loads(frame) if frame else {"error": "its supervisor exited while starting"}
            if "error" in reply:
                raise SandboxUnavailableError(f"{reply['error']}; {NO_FALLBACK}")
        except BaseException:
            host_end.close()
            raise
        host_end.setblocking(False)
        return _Box(id=f"local-{uuid.uuid4().hex[:16]}", pid=reply["pid"], uid=uid, sock=host_end)


def not_running(box: _Box) -> SandboxNotRunningError:
    return SandboxNotRunningError(box.id, message=f"sandbox {box.id} is not running: {box.dead}")
