"""Local sandbox transport: the calls verifiers' SandboxEnv makes on prime_sandboxes' async client
(create, wait_for_creation, execute_command, delete, bulk_delete, teardown), answered by sandboxes
on this machine, isolated with bubblewrap and Linux namespaces (the process tree is in worker.py).

The first `create` starts a fork server that imports torch once; a few idle sandboxes are kept
forked ahead, so `create` is a queue pop and the first cell answers in milliseconds.
"""

import asyncio
import atexit
import contextlib
import importlib.metadata
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
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

from ptenv.sandbox.commands import one_line
from ptenv.sandbox.framing import FRAME, MAX_FRAME, recv_frame
from ptenv.sandbox.worker import GRACE, SCRATCH_MB, WORKER_FILES

POOL_SIZE = 4  # idle sandboxes kept ready
START_TIMEOUT = 60.0  # fork server start (imports torch)
SPAWN_TIMEOUT = 30.0
HOST_MARGIN = 5.0  # past a command's own deadline, the supervisor itself is considered hung
DEFAULT_TIMEOUT = 300.0  # prime_sandboxes' default per command
UID_SLOTS = 1 << 16  # each client takes a random block of uids; one uid per sandbox
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


class SandboxUnavailableError(RuntimeError):
    """This machine cannot isolate a sandbox (no bubblewrap, no namespaces, not root)."""


def sandbox_command(argv: list[str], privileged: bool = False) -> list[str]:
    """`bwrap ... -- argv`: the filesystem and namespaces every sandbox process lives in.

    Visible, read-only: /usr (and the /bin, /lib... links into it), a few /etc files, the Python
    installation, the venv's site-packages (with this project's own installed files masked) and
    the five worker files. Nothing of the repo, /work, /root or the Hugging Face cache.
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
    }
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    args += ["--die-with-parent", "--new-session", "--clearenv"]
    if privileged:  # the fork server needs root's capabilities to build each sandbox's namespaces
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
    source = Path(__file__).resolve().parents[2]
    binds += [(str(source / rel), f"{PTENV_ROOT}/{rel}") for rel in WORKER_FILES]
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
    return args + ["--chdir", "/tmp", "--", *argv]


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
    uid: int
    sock: socket.socket
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dead: str | None = None  # why it no longer answers


class LocalSandboxClient:
    """prime_sandboxes.AsyncSandboxClient's interface, as SandboxEnv uses it, on local sandboxes."""

    def __init__(self, cell_timeout: float = 30.0, memory_limit_mb: int = 2048):
        self.cell_timeout = cell_timeout
        self.memory_limit_mb = memory_limit_mb
        self._boxes: dict[str, _Box] = {}
        self._pool: queue.Queue = queue.Queue()  # idle _Box, or the error that stopped the refill
        self._cond = threading.Condition()
        self._waiting = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._zygote: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._control_lock = threading.Lock()
        self._uid_base = 1_000_000 + random.randrange(60_000) * UID_SLOTS
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
        try:
            box = self._pool.get_nowait()
        except queue.Empty:
            box = await asyncio.to_thread(self._wait_for_box)
        if isinstance(box, Exception):
            self._pool.put(box)  # every later create fails the same way
            raise box
        with self._cond:
            self._cond.notify_all()
        self._boxes[box.id] = box
        now = datetime.now(timezone.utc)
        return Sandbox(
            id=box.id,
            name=request.name,
            docker_image=request.docker_image or "local",
            cpu_cores=1,
            memory_gb=self.memory_limit_mb / 1024,
            disk_size_gb=SCRATCH_MB / 1024,
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
        """Run `command` with /bin/sh in the sandbox (or serve `ptenv-session ...`, see commands.py).

        Raises CommandTimeoutError when a shell command runs past `timeout` (its process group is
        killed), SandboxNotRunningError for an unknown, deleted or broken sandbox."""
        box = self._live_box(sandbox_id)
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        request = {"command": command, "cwd": working_dir, "timeout": timeout}
        reply = await self._roundtrip(box, request, timeout + GRACE + HOST_MARGIN)
        if reply.get("timed_out") is True:
            raise CommandTimeoutError(sandbox_id, short(command), timeout)
        if "error" in reply:  # the supervisor could not serve the command (e.g. the model broke it)
            self._stop(box, one_line(reply["error"]))
        else:
            try:
                return CommandResponse(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"])
            except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
                self._stop(box, "it sent a malformed reply")
        raise not_running(box)

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
        if self._zygote is not None and self._zygote.poll() is None:
            # bwrap's --die-with-parent chain takes the fork server and every sandbox down with it.
            os.killpg(self._zygote.pid, signal.SIGKILL)
            self._zygote.wait()
        for box in list(self._boxes.values()):
            self._stop(box, "the sandbox client was torn down")
            box.sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        while True:  # idle sandboxes in the pool: their supervisors died with the fork server
            try:
                box = self._pool.get_nowait()
            except queue.Empty:
                break
            if isinstance(box, _Box):
                box.sock.close()
        if self._control is not None:
            self._control.close()

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
            payload = json.dumps(request).encode()
            try:
                async with asyncio.timeout(wait):
                    await loop.sock_sendall(box.sock, FRAME.pack(len(payload)) + payload)
                    frame = await recv_frame_async(loop, box.sock)
            except TimeoutError:
                self._stop(box, f"it did not answer within {wait:g} s")
                raise CommandTimeoutError(box.id, short(request["command"]), request["timeout"]) from None
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
            if not isinstance(reply, dict):
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
        """Have the fork server SIGKILL each supervisor (and so its pid namespace) and reap it."""
        request = {"op": "kill", "sandboxes": [[b.pid, b.uid] for b in boxes]}
        try:
            with self._control_lock:
                self._control.send(json.dumps(request).encode())
                self._control.settimeout(SPAWN_TIMEOUT)
                self._control.recv(65536)
        except OSError:
            pass  # the fork server is gone, and every sandbox with it

    # -- the pool and the fork server

    def _wait_for_box(self):
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
        try:
            return self._pool.get(timeout=START_TIMEOUT + SPAWN_TIMEOUT)
        except queue.Empty:
            return SandboxUnavailableError(f"no sandbox became ready within {START_TIMEOUT + SPAWN_TIMEOUT:g} s")
        finally:
            with self._cond:
                self._waiting -= 1

    def _refill(self) -> None:
        """Background thread: starts the fork server, then keeps POOL_SIZE idle sandboxes ready.

        It also owns the fork server process, whose bwrap dies with the thread that started it."""
        try:
            self._start_zygote()
            while True:
                with self._cond:
                    while not self._closed and self._pool.qsize() >= POOL_SIZE + self._waiting:
                        self._cond.wait()
                    if self._closed:
                        return
                self._pool.put(self._spawn())
        except Exception as e:
            if not self._closed:
                error = e if isinstance(e, SandboxUnavailableError) else SandboxUnavailableError(one_line(e))
                self._pool.put(error)

    def _start_zygote(self) -> None:
        if os.geteuid() != 0:
            raise SandboxUnavailableError(
                "the local sandbox must run as root: it mounts each sandbox's private /tmp and gives "
                f"each sandbox its own unprivileged uid; {NO_FALLBACK}"
            )
        host_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        python = os.path.realpath(sys.executable)  # inside, no venv: site-packages come via PYTHONPATH
        argv = [python, "-S", "-P", "-m", "ptenv.sandbox.worker", "zygote", str(zygote_end.fileno())]
        self._zygote = subprocess.Popen(
            sandbox_command(argv, privileged=True),
            pass_fds=[zygote_end.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches the host only; teardown kills the group
        )
        zygote_end.close()
        host_end.settimeout(START_TIMEOUT)
        try:
            ready = host_end.recv(65536)
        except TimeoutError:
            ready = b""
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._zygote.pid, signal.SIGKILL)
            _, err = self._zygote.communicate(timeout=10)
            lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
            reason = lines[-1].strip() if lines else f"it exited with code {self._zygote.returncode}"
            raise SandboxUnavailableError(
                f"cannot start the sandbox fork server: {reason}. It needs bubblewrap and Linux "
                f"namespaces (run as root, or enable them: sysctl user.max_user_namespaces=10000); {NO_FALLBACK}"
            )
        self._zygote.stderr.close()
        self._control = host_end
        atexit.register(self.teardown)

    def _spawn(self) -> _Box:
        host_end, sandbox_end = socket.socketpair()
        uid = self._uid_base + self._slots % UID_SLOTS
        self._slots += 1
        request = {"op": "spawn", "uid": uid, "cell_timeout": self.cell_timeout, "memory_mb": self.memory_limit_mb}
        try:
            with self._control_lock, sandbox_end:
                self._control.settimeout(SPAWN_TIMEOUT)
                socket.send_fds(self._control, [json.dumps(request).encode()], [sandbox_end.fileno()])
                msg = self._control.recv(65536)
            reply = json.loads(msg) if msg else {"error": "the sandbox fork server exited"}
            if "error" not in reply:
                host_end.settimeout(SPAWN_TIMEOUT)
                frame = recv_frame(host_end)
                reply |= json.loads(frame) if frame else {"error": "its supervisor exited while starting"}
            if "error" in reply:
                raise SandboxUnavailableError(f"{reply['error']}; {NO_FALLBACK}")
        except BaseException:
            host_end.close()
            raise
        host_end.setblocking(False)
        return _Box(id=f"local-{uuid.uuid4().hex[:16]}", pid=reply["pid"], uid=uid, sock=host_end)


async def recv_frame_async(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes | None:
    header = await recv_exact_async(loop, sock, FRAME.size)
    if header is None:
        return None
    (n,) = FRAME.unpack(header)
    if n > MAX_FRAME:
        raise ValueError(f"reply of {n} bytes is over the {MAX_FRAME}-byte cap")
    return await recv_exact_async(loop, sock, n)


async def recv_exact_async(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def not_running(box: _Box) -> SandboxNotRunningError:
    return SandboxNotRunningError(box.id, message=f"sandbox {box.id} is not running: {box.dead}")


def short(command: str) -> str:
    return command if len(command) <= 80 else command[:77] + "..."

