"""The processes inside the sandbox: fork server, per-sandbox supervisor, Python session.

Mounted read-only into the sandbox with codec.py and session_ns.py, so it imports only the
standard library, torch and those two. Started by the host as
`bwrap ... python -S -P -m ptenv.sandbox.worker zygote <control fd>`. Process tree:

    bwrap -> fork server (root; imports torch once)
               -> supervisor (PID 1 of its own pid/mount/net/ipc/uts namespaces; sandbox uid)
                    -> session   (runs the model's cells in one persistent namespace)
                    -> /bin/sh   (one per bash command)

Model code runs only in the session and in shells, as the sandbox's own unprivileged uid.
"""

import ast
import base64
import binascii
import ctypes
import gc
import json
import linecache
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback

import torch

from ptenv import codec
from ptenv.sandbox.framing import recv_frame, send_frame
from ptenv.session_ns import new_namespace

# This module and everything it imports of this package: all a sandbox ever sees of it.
WORKER_FILES = (
    "ptenv/__init__.py",
    "ptenv/codec.py",
    "ptenv/session_ns.py",
    "ptenv/sandbox/__init__.py",
    "ptenv/sandbox/framing.py",
    "ptenv/sandbox/worker.py",
)
CAP = 16 * 1024  # bytes of stdout / stderr / traceback kept per cell or command
GRACE = 2.0  # seconds the supervisor waits past a cell's limit before killing the session
SCRATCH_MB = 256  # private writable /tmp (tmpfs: it vanishes with the sandbox)
SHM_MB = 64
FILE_MB = 128
NPROC = 64
NOFILE = 1024
CPU_PER_CELL_LIMIT = 10  # CPU seconds per session or shell = this many full-length cells
SANDBOX_PATH = "/tmp"
MEMORY_POLL = 0.2  # seconds between checks of a sandbox's total memory while a command runs
SESSION_BROKEN = 70

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

libc = ctypes.CDLL(None, use_errno=True)


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def close_fds_except(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the fd of the listdir itself


# ---------------------------------------------------------------- fork server


def zygote(control_fd: int) -> None:
    """Import torch once, then fork one supervisor per spawn request on the control socket."""
    # A forked child of a parent that ran a multi-threaded op hangs in its next parallel op.
    torch.set_num_threads(1)
    warm_up()
    gc.freeze()  # keep the collector from touching (and so copying) the parent's objects
    control = socket.socket(fileno=control_fd)
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    live: dict[int, int] = {}  # supervisor pid -> sandbox uid
    control.send(json.dumps({"ready": True}).encode())
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 2)  # the host reads our stderr only while we start
    while True:
        ready, _, _ = select.select([control], [], [], 0.5)
        reap_supervisors(live)
        if not ready:
            continue
        msg, fds, _, _ = socket.recv_fds(control, 65536, 1)
        if not msg:  # the host is gone: take every sandbox with us
            kill_supervisors(live, list(live.items()))
            return
        request = json.loads(msg)
        if request["op"] == "spawn":
            reply = spawn(fds[0], request, own_pid_ns, control)
            if "pid" in reply:
                live[reply["pid"]] = request["uid"]
        else:
            kill_supervisors(live, [tuple(p) for p in request["sandboxes"]])
            reply = {"ok": True}
        for fd in fds:
            os.close(fd)
        control.send(json.dumps(reply).encode())


def warm_up() -> None:
    """Run once what every session runs, so forks start warm."""
    x = torch.ones(4, 4)
    repr(codec.decode(codec.encode(x @ x)))  # printing a tensor imports a few modules lazily
    layer = torch.nn.Linear(4, 2)
    layer(x).sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    namespace = new_namespace({"x": x})
    exec(compile("y = x + 1", "<warm-up>", "exec"), namespace)
    traceback.format_exception(ValueError("warm-up"))
    ast.parse("x")
    import site

    site.setquit()  # `exit()` in a cell behaves as in a normal interpreter (we start with -S)


def spawn(channel_fd: int, request: dict, own_pid_ns: int, control: socket.socket) -> dict:
    """Fork the sandbox's supervisor as PID 1 of a new pid namespace; return its pid."""
    try:
        check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        pid, error = os.fork(), None
    except OSError as e:
        pid, error = None, e
    if pid == 0:
        os.close(control.detach())
        try:
            start_sandbox(channel_fd, request)
        finally:
            os._exit(0)
    # Children forked later must land in our own pid namespace again, not in the new one.
    check(libc.setns(own_pid_ns, CLONE_NEWPID), "setns(pid)")
    return {"error": f"cannot create the sandbox: {error}"} if error else {"pid": pid}


def exited_children():
    """Reap every child that has exited, without waiting; yields (pid, wait status)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def reap_supervisors(live: dict[int, int]) -> None:
    for pid, _ in exited_children():
        live.pop(pid, None)


def kill_supervisors(live: dict[int, int], sandboxes: list[tuple[int, int]]) -> None:
    """SIGKILL each supervisor (its whole pid namespace dies with it) and wait until it is gone."""
    doomed = [pid for pid, uid in sandboxes if live.get(pid) == uid]
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    for pid in doomed:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        live.pop(pid, None)


# ---------------------------------------------------------------- supervisor (PID 1 of a sandbox)


def describe(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code == SESSION_BROKEN:
        return "broke (a cell damaged the code that runs cells)"
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name
    return f"was killed by {name}" + (" (the CPU time limit)" if name == "SIGXCPU" else "")


class Capture:
    """Keeps the first CAP bytes of a stream and counts the rest."""

    def __init__(self):
        self.head = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = CAP - len(self.head)
        if room > 0:
            self.head += data[:room]

    def text(self) -> str:
        return self.head.decode("utf-8", "replace")

    @property
    def cut(self) -> int:
        return self.total - len(self.head)


def parse_session_reply(frame: bytes | None) -> tuple[str | None, str]:
    """(status, traceback) from the session's reply to a cell; (None, "") if there is none."""
    try:
        reply = json.loads(frame)
        status, tb = reply["status"], reply["traceback"]
    except (TypeError, ValueError, KeyError):
        return None, ""
    if status not in ("ok", "error", "timeout") or not isinstance(tb, str):
        return None, ""
    return status, tb


def live_pids() -> list[int]:
    """The processes of this sandbox that are not zombies (this /proc shows only our namespace)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != b"Z":
                pids.append(int(name))
    return pids


def cell_doc(status, stdout, stderr, stdout_cut, stderr_cut, reset, limit) -> str:
    """The JSON document a cell (or a preload) answers with; `reset` says why variables were lost."""
    return json.dumps({
        "status": status,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_cut": stdout_cut,
        "stderr_cut": stderr_cut,
        "reset": reset,
        "limit": limit,
    })


def read_available(fd: int, sink: Capture) -> None:
    """Read what is in a non-blocking pipe now; bounded, as a background writer may never stop."""
    for _ in range(64):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        sink.feed(data)


def with_notice(capture: Capture) -> str:
    text = capture.text()
    return text + f"\n[... {capture.cut} more bytes cut]" if capture.cut else text


def start_sandbox(channel_fd: int, config: dict) -> None:
    """In the freshly forked PID 1 of a local sandbox: isolate, then serve the host's channel."""
    channel = socket.socket(fileno=channel_fd)
    try:
        isolate(config["uid"], config["memory_mb"], channel.fileno())
    except BaseException as e:
        send_frame(channel, json.dumps({"error": f"cannot isolate the sandbox: {e}"}).encode())
        raise
    supervisor = Supervisor(channel, config["cell_timeout"], owns_pid_namespace=True, memory_mb=config["memory_mb"])
    send_frame(channel, json.dumps({"ready": True}).encode())
    supervisor.serve()


def isolate(uid: int, memory_mb: int, channel_fd: int) -> None:
    """Own mount, network, IPC and UTS namespaces, a fresh /proc and scratch, rlimits, and no root."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # A fresh /proc shows only this sandbox's processes.
    check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    for path, mb in ((b"/tmp", SCRATCH_MB), (b"/dev/shm", SHM_MB)):
        opts = f"size={mb}m,mode=0700,uid={uid},gid={uid}".encode()
        check(libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"mount {path}")
    check(libc.sethostname(b"sandbox", 7), "sethostname")
    close_fds_except({channel_fd})
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    # The address space already holds torch (copy-on-write from the fork server).
    with open("/proc/self/status") as f:
        vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limits = {
        resource.RLIMIT_AS: vm_kb * 1024 + memory_mb * 1024 * 1024,
        resource.RLIMIT_NPROC: NPROC,  # per uid, and each sandbox has its own uid
        resource.RLIMIT_FSIZE: FILE_MB * 1024 * 1024,
        resource.RLIMIT_NOFILE: NOFILE,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    # Dropping from uid 0 to another uid clears every capability.
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    # Not dumpable: the model's processes (same uid) cannot ptrace us or read our memory.
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    os.chdir(SANDBOX_PATH)


class Supervisor:
    """Serves the commands for one sandbox; owns the session and the shells.

    Locally it is PID 1 of the sandbox's own PID namespace, so everything else in there is the
    model's to kill. In a container it serves the session beside other processes (serve()), and
    only ever kills what it started."""

    def __init__(self, channel: socket.socket, cell_timeout: float, owns_pid_namespace: bool, memory_mb: int | None):
        self.channel = channel  # its end means the sandbox was deleted
        self.cell_timeout = cell_timeout
        self.owns_pid_namespace = owns_pid_namespace
        # RLIMIT_AS bounds each process; this bounds their sum (a sandbox may run many).
        self.memory_mb = memory_mb
        self.next_memory_check = 0.0  # set when each command starts
        # Not on the supervisor itself: it lives as long as the sandbox.
        cpu = max(1, round(CPU_PER_CELL_LIMIT * self.cell_timeout))
        self.cpu_limit = (cpu, cpu + 5)  # past the soft limit SIGXCPU, past the hard one SIGKILL
        self.env = dict(os.environ)
        self.inputs = "{}"  # encoded inputs as JSON text; every fresh session loads them
        self.session = None
        self.start_session()

    # -- requests from the host

    def serve(self) -> None:
        while True:
            frame = recv_frame(self.channel)
            if frame is None:
                return  # the host closed the sandbox: exiting as PID 1 kills everything in it
            send_frame(self.channel, self.answer(frame))

    def answer(self, frame: bytes) -> bytes:
        request = json.loads(frame)
        try:
            reply = self.handle(request["command"], request["cwd"], request["timeout"])
            if self.owns_pid_namespace:
                self.sweep()
        except Exception as e:  # a bug here must reach the host as an error, not as silence
            reply = {"error": f"the sandbox supervisor failed: {type(e).__name__}: {e}"}
        return json.dumps(reply).encode()

    def handle(self, command: str, cwd: str | None, timeout: float) -> dict:
        words = command.split()
        # `ptenv-session ...` is served here instead of by a shell: it keeps an empty cell to a
        # few ms. The same commands go through a real client script where the sandbox is remote.
        if words and words[0] == "ptenv-session":
            return self.builtin(words[1:], min(timeout, self.cell_timeout))
        return self.shell(command, cwd or SANDBOX_PATH, timeout)

    def builtin(self, args: list[str], limit: float) -> dict:
        """Serve `ptenv-session ...`; its stdout is one JSON document that the host parses."""
        try:
            if args == ["result"]:
                doc = self.read_result(limit)
            elif args[:1] == ["exec"] and len(args) <= 2:  # an empty cell encodes to nothing
                doc = self.exec_cell(base64.b64decode("".join(args[1:]), validate=True).decode(), limit)
            elif len(args) == 2 and args[0] == "preload":
                doc = self.preload(base64.b64decode(args[1], validate=True).decode(), limit)
            else:
                usage = "usage: ptenv-session exec <base64 code> | preload <base64 json> | result"
                return {"stdout": "", "stderr": usage, "exit_code": 2}
        except (binascii.Error, UnicodeDecodeError) as e:
            return {"stdout": "", "stderr": f"ptenv-session: bad argument: {e}", "exit_code": 2}
        return {"stdout": doc, "stderr": "", "exit_code": 0}

    # -- the session

    def start_session(self) -> None:
        control, child_end = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(self.channel.detach())
                os.close(control.detach())
                close_fds_except({child_end.fileno(), out_w, err_w})
                resource.setrlimit(resource.RLIMIT_CPU, self.cpu_limit)
                # The model's own processes may be inspected (we read their memory use); we may not.
                check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
                Session(child_end, out_w, err_w, self.inputs).serve()
            finally:
                os._exit(SESSION_BROKEN)  # a cell broke the session's own code (e.g. patched builtins)
        child_end.close()
        os.close(out_w)
        os.close(err_w)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.session = {
            "pid": pid, "status": None, "control": control, "out": out_r, "err": err_r, "pidfd": os.pidfd_open(pid)
        }

    def restart_session(self) -> None:
        """Kill everything in the sandbox but us, then fork a fresh session with the inputs."""
        s = self.session
        for _ in range(100):  # a fork bomb may need a few rounds
            try:
                # The session leads its own process group; as PID 1 we may kill everything else.
                os.kill(-1 if self.owns_pid_namespace else -s["pid"], signal.SIGKILL)
            except ProcessLookupError:
                break
            while True:
                try:
                    os.waitpid(-1 if self.owns_pid_namespace else -s["pid"], 0)
                except ChildProcessError:
                    break
        s["control"].close()
        for fd in (s["out"], s["err"], s["pidfd"]):
            os.close(fd)
        self.start_session()

    def session_death(self) -> str | None:
        """Why the session is gone, or None while it lives."""
        s = self.session
        if not select.select([s["pidfd"]], [], [], 0)[0]:
            return None
        self.reap()
        return describe(s["status"]) if s["status"] is not None else "ended"

    def ask_session(self, request: dict, limit: float, capture: tuple[Capture, Capture] | None):
        """Send a request and wait for the reply; returns (reply bytes | None, reason it failed)."""
        s = self.session
        deadline = time.monotonic() + limit + GRACE
        try:
            s["control"].settimeout(limit + GRACE)  # a wedged session must not wedge us
            send_frame(s["control"], json.dumps(request).encode())
        except TimeoutError:
            return None, None
        except OSError:
            return None, "closed its control channel"
        finally:
            s["control"].settimeout(None)
        watch = [s["control"], s["pidfd"], self.channel]
        self.next_memory_check = time.monotonic() + MEMORY_POLL  # a quick request never pays for a look
        if capture:
            watch += [s["out"], s["err"]]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, None  # ran past the limit
            ready, _, _ = select.select(watch, [], [], min(left, MEMORY_POLL))
            if self.channel in ready and not self.channel.recv(1, socket.MSG_PEEK):
                os._exit(0)  # the host deleted the sandbox mid-cell
            if capture:
                self.drain(capture)
            if s["control"] in ready:
                s["control"].settimeout(max(deadline - time.monotonic(), 0.01))
                try:
                    frame = recv_frame(s["control"])
                except (OSError, ValueError):
                    frame = None
                s["control"].settimeout(None)
                if frame is not None:
                    return frame, None
                # A dying process closes its sockets before it is done exiting: wait a moment.
                select.select([s["pidfd"]], [], [], 1.0)
                return None, self.session_death() or "closed its control channel"
            if s["pidfd"] in ready:
                return None, self.session_death() or "ended"
            if self.over_memory():
                return None, f"used more than its {self.memory_mb} MiB of memory"

    def over_memory(self) -> bool:
        """Whether the sandbox's processes (but us) hold more than the limit, shared pages counted once.
        Looked at once per MEMORY_POLL at most: a busy command wakes us far more often."""
        now = time.monotonic()
        if self.memory_mb is None or now < self.next_memory_check:
            return False
        self.next_memory_check = now + MEMORY_POLL
        total_kb = 0
        for pid in live_pids():
            if pid != os.getpid():
                try:
                    with open(f"/proc/{pid}/smaps_rollup") as f:
                        total_kb += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
                except (OSError, StopIteration, ValueError):
                    continue  # gone meanwhile
        return total_kb > self.memory_mb * 1024

    def drain(self, capture: tuple[Capture, Capture]) -> None:
        for fd, sink in zip((self.session["out"], self.session["err"]), capture):
            read_available(fd, sink)

    def exec_cell(self, code: str, limit: float) -> str:
        reset = self.session_death()  # it may have died between cells (e.g. the CPU limit)
        if reset:
            self.restart_session()
        out, err = Capture(), Capture()
        frame, failure = self.ask_session({"op": "exec", "code": code, "limit": limit}, limit, (out, err))
        self.drain((out, err))
        status, tb = parse_session_reply(frame)
        if status is None:
            if frame is None and failure is None:
                status, reset = "timeout", "ran past the time limit"
            else:
                status, reset = "reset", failure or "sent a malformed reply"
            self.restart_session()
        if len(tb) > CAP:
            tb = "...\n" + tb[-CAP:]
        return cell_doc(status, out.text(), err.text() + tb, out.cut, err.cut, reset, limit)

    def preload(self, inputs: str, limit: float) -> str:
        if self.session_death():
            self.restart_session()
        frame, failure = self.ask_session({"op": "load", "inputs": inputs}, limit, None)
        error = "" if frame == b"ok" else (frame or b"").decode("utf-8", "replace")[:CAP]
        if frame is None:
            self.restart_session()
            error = f"loading the inputs failed: the session {failure or 'ran past the time limit'}"
        elif not error:
            self.inputs = inputs
        return cell_doc("error" if error else "ok", "", error, 0, 0, None, limit)

    def read_result(self, limit: float) -> str:
        if self.session_death():
            self.restart_session()
            return json.dumps({"status": "missing"})
        frame, failure = self.ask_session({"op": "result"}, limit, None)
        if frame is None:
            self.restart_session()
            reason = f"reading result failed: the session {failure or 'ran past the time limit'}"
            return json.dumps({"status": "invalid", "reason": reason})
        return frame.decode("utf-8", "replace")  # the host parses it strictly

    # -- shell commands

    def shell(self, command: str, cwd: str, timeout: float) -> dict:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open("/dev/null", os.O_RDONLY)
        actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
        step = f"cd: {cwd}"
        try:
            os.chdir(cwd)
            step = "cannot start /bin/sh"
            # Python ignores SIGPIPE and SIGXFSZ; a shell gets the usual defaults back.
            pid = os.posix_spawn(
                "/bin/sh", ["sh", "-c", command], self.env, file_actions=actions, setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except OSError as e:
            for fd in (out_r, err_r):
                os.close(fd)
            return {"stdout": "", "stderr": f"sh: {step}: {e.strerror}\n", "exit_code": 2}
        finally:
            os.chdir(SANDBOX_PATH)
            for fd in (out_w, err_w, devnull):
                os.close(fd)
        pidfd = os.pidfd_open(pid)
        try:
            resource.prlimit(pid, resource.RLIMIT_CPU, self.cpu_limit)
        except ProcessLookupError:
            pass  # already done
        out, err = Capture(), Capture()
        streams = {out_r: out, err_r: err}
        for fd in streams:
            os.set_blocking(fd, False)
        deadline = time.monotonic() + timeout
        self.next_memory_check = time.monotonic() + MEMORY_POLL
        over_memory = False
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pidfd, self.channel, *streams], [], [], min(max(left, 0), MEMORY_POLL))
            if self.channel in ready and not self.channel.recv(1, socket.MSG_PEEK):
                os._exit(0)
            for fd, sink in streams.items():
                read_available(fd, sink)
            over_memory = pidfd not in ready and self.over_memory()
            if pidfd in ready or left <= 0 or over_memory:
                break
        timed_out = pidfd not in ready and not over_memory
        if over_memory:
            os.killpg(pid, signal.SIGKILL)
            err.feed(f"\n[killed: the sandbox used more than its {self.memory_mb} MiB of memory]\n".encode())
        if timed_out:
            os.killpg(pid, signal.SIGKILL)
        # The command is over when the shell exits; a background job may keep the pipes open.
        _, status = os.waitpid(pid, 0)
        for fd in (out_r, err_r, pidfd):
            os.close(fd)
        if timed_out:
            return {"timed_out": True}
        code = os.waitstatus_to_exitcode(status)
        return {"stdout": with_notice(out), "stderr": with_notice(err), "exit_code": code if code >= 0 else 128 - code}

    def sweep(self) -> None:
        """Kill every process but us and the session: what a cell or a command started (a
        background job, a fork bomb) does not outlive it."""
        keep = {os.getpid(), self.session["pid"]}
        for _ in range(100):
            others = [pid for pid in live_pids() if pid not in keep]
            if not others:
                return
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.reap()  # orphans are ours; the session reaps its own children

    def reap(self) -> None:
        """As PID 1 we inherit every orphan: reap them all, remembering how the session ended."""
        for pid, status in exited_children():
            if pid == self.session["pid"]:
                self.session["status"] = status


# ---------------------------------------------------------------- session (runs the model's cells)


class CellTimeout(BaseException):
    """Raised into a cell by SIGALRM; a BaseException so `except Exception` in a cell misses it."""


class Session:
    """One persistent namespace. Model code runs here and may break anything in this process, so
    the replies use references taken before any cell ran, and the host checks them anyway."""

    def __init__(self, control: socket.socket, out_fd: int, err_fd: int, inputs: str):
        self.control = control
        self.out_fd, self.err_fd = out_fd, err_fd
        self.me = os.getpid()
        self.cells = 0
        self.running = False
        self.tensor_types = (torch.Tensor, torch.nn.Parameter)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.setpgid(0, 0)  # what the session starts can be killed as one group
        signal.signal(signal.SIGALRM, self.on_alarm)
        signal.signal(signal.SIGCHLD, reap_children)
        self.namespace = new_namespace({})
        self.load(inputs)

    def serve(self) -> None:
        dumps, loads, getpid, exit_now = json.dumps, json.loads, os.getpid, os._exit
        recv, send = recv_frame, send_frame
        while True:
            frame = recv(self.control)
            if frame is None:
                exit_now(0)
            request = loads(frame)
            op = request["op"]
            if op == "exec":
                reply = dumps(self.run_cell(request["code"], request["limit"])).encode()
            elif op == "load":
                reply = self.load(request["inputs"]).encode()
            else:
                reply = dumps(self.read_result()).encode()
            if getpid() != self.me:
                exit_now(0)  # a process the cell forked must not answer for the session
            send(self.control, reply)

    def load(self, inputs: str) -> str:
        """Start a fresh namespace with the inputs preloaded; 'ok' or a one-line error."""
        try:
            encoded = json.loads(inputs)
            if not isinstance(encoded, dict):
                return f"inputs must be a JSON object, got {type(encoded).__name__}"
            tensors = {}
            for name, obj in encoded.items():
                if not name.isidentifier():
                    return f"input name {name!r} is not a Python identifier"
                try:
                    tensors[name] = codec.decode(obj)
                except codec.CodecError as e:
                    return f"input {name!r}: {e}"
        except ValueError as e:
            return f"inputs are not valid JSON: {e}"
        self.namespace = new_namespace(tensors)
        return "ok"

    def on_alarm(self, signum, frame):
        if self.running:
            self.running = False
            raise CellTimeout

    def run_cell(self, code: str, limit: float) -> dict:
        self.cells += 1
        filename = f"<cell {self.cells}>"
        os.dup2(self.out_fd, 1)  # the model may have closed or moved them last time
        os.dup2(self.err_fd, 2)
        # During a cell its child processes are its own to wait for (subprocess needs their status).
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        status, tb = "ok", ""
        try:
            try:
                body, last = compile_cell(code, filename)
                linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
                self.running = True
                signal.setitimer(signal.ITIMER_REAL, limit)
                exec(body, self.namespace)
                if last is not None:
                    value = eval(last, self.namespace)
                    if value is not None:
                        print(repr(value))
            finally:
                self.running = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CellTimeout:
            status = "timeout"
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the session goes on
            status, tb = "error", format_error(e)
        flush_stdio()
        # Between cells the supervisor kills whatever the cell left running; we reap those.
        signal.signal(signal.SIGCHLD, reap_children)
        reap_children()
        return {"status": status, "traceback": tb}

    def read_result(self) -> dict:
        value = self.namespace.get("result", self)
        if value is self:
            return {"status": "missing"}
        try:
            if type(value) not in self.tensor_types:
                return {"status": "invalid", "reason": f"result is a {type(value).__name__}, not a torch.Tensor"}
            if value.is_meta:
                return {"status": "invalid", "reason": "result is a meta tensor"}
            return {"status": "ok", "result": codec.encode(value)}
        except codec.CodecError as e:
            return {"status": "invalid", "reason": f"result is invalid: {e}"}
        except BaseException as e:
            return {"status": "invalid", "reason": f"result could not be encoded: {type(e).__name__}"}


def reap_children(*_) -> None:
    for _ in exited_children():
        pass


def compile_cell(code: str, filename: str):
    """Compile a cell; a last expression statement is evaluated separately and its repr shown."""
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval")
    return compile(tree, filename, "exec"), last


def format_error(e: BaseException) -> str:
    """The traceback without the session's own frames."""
    try:
        tb = e.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
            tb = tb.tb_next
        if tb is None:  # a syntax error: no frame of the cell ever ran
            return "".join(traceback.format_exception_only(type(e), e))
        return "".join(traceback.format_exception(type(e), e, tb))
    except BaseException:
        return f"{type(e).__name__} (its traceback could not be formatted)\n"


def flush_stdio() -> None:
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
        try:
            stream.flush()
        except BaseException:
            pass


def serve(socket_path: str) -> None:
    """In a container (Prime): one session for the whole container, served on a unix socket to the
    `ptenv-session` client (ptenv/sandbox/client.py). The container is the isolation."""
    torch.set_num_threads(1)  # as locally: the session is a fork of this process
    warm_up()
    # Nothing outside deletes a container's session: its channel is one whose other end we keep.
    _other_end, channel = socket.socketpair()
    cell_timeout = float(os.environ.get("PTENV_CELL_TIMEOUT", "30"))
    # The container's own memory limit covers everything in it.
    supervisor = Supervisor(channel, cell_timeout, owns_pid_namespace=False, memory_mb=None)
    server = socket.socket(socket.AF_UNIX)
    server.bind(socket_path + ".tmp")
    os.rename(socket_path + ".tmp", socket_path)  # appears only once it listens
    server.listen()
    while True:
        conn, _ = server.accept()
        with conn:
            frame = recv_frame(conn)
            if frame is not None:
                send_frame(conn, supervisor.answer(frame))


USAGE = "usage: python -m ptenv.sandbox.worker zygote <control fd> | serve <socket path>"

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("zygote", "serve"):
        sys.exit(USAGE)
    zygote(int(sys.argv[2])) if sys.argv[1] == "zygote" else serve(sys.argv[2])
