"""The supervisor: our process inside a sandbox. It serves the host's requests, owns the model's
processes (the interpreter, the shells, a trial's callers), and enforces the sandbox's limits.

Locally it is PID 1 of the sandbox's own PID namespace, running as a uid of its own, while
everything it starts runs as the model's uid (isolation.py). In a container (Prime) it serves
the interpreter beside other processes and only ever kills what it started.

The rule it keeps: whatever the interpreter sends or fails to send (malformed, oversized, nested,
slow, silent or dead) is the model's answer and becomes a well-formed reply (replies.py); only a
failure of the supervisor itself reaches the host, as an error: a harness fault.
"""

import json
import os
import resource
import signal
import socket
import time

from ptenv.inside import cgroups, shell, trial
from ptenv.inside.children import exited_children
from ptenv.inside.isolation import SCRATCH, ModelUser, become_model, close_fds_except
from ptenv.inside.memory import MEMORY_POLL, MemoryWatch, live_pids
from ptenv.inside.processes import ModelProcess
from ptenv.inside.protocol import Limits, readable, recv_frame, send_frame, send_pieces
from ptenv.inside.replies import describe
from ptenv.inside.session import Session
from ptenv.inside.streams import Capture, paced, read_paced
from ptenv.inside.syscalls import CAP_SETGID, CAP_SETUID, has_capabilities

MODEL_NICE = 19  # the model's processes' nice value without a cgroup (enter_model_side)
CONTAINER_MODEL_UID = 1_000_000  # the model's uid in a container we run as root in (no passwd entry)

# Each request's fields besides id, op and timeout. An op has this one name on every hop: the host's
# request, this supervisor's handler, the interpreter's op.
REQUESTS = {"shell": ("command", "cwd"), "run_cell": ("code",), "preload": ("inputs",), "read_result": (),
            "end_session": (), "trial": ("source", "name", "inputs", "cases", "call_limit", "allowlist", "trace")}


class Supervisor:
    """Serves the requests for one sandbox; owns the interpreter, the shells and the callers."""

    def __init__(self, channel: socket.socket, limits: Limits, model: ModelUser | None,
                 cgroup: dict[str, int] | None = None, owns_pid_namespace: bool = True, session: bool = True):
        self.channel = channel  # its end means the sandbox was deleted
        self.limits = limits
        self.model = model  # None in a container we do not run as root in: the model runs as we do
        self.cgroup = cgroup  # fds of the model's cgroup (cgroups.py), or None
        self.owns_pid_namespace = owns_pid_namespace  # False in a container: we are not its PID 1
        self.memory = MemoryWatch(limits, cgroup, owns_pid_namespace)
        cpu = max(1, round(limits.cpu_per_cell_limit * limits.cell_timeout))
        self.cpu_limit = (cpu, cpu + 5)  # past the soft limit SIGXCPU, past the hard one SIGKILL
        self.env = dict(os.environ)
        self.callers: dict[int, ModelProcess] = {}  # a trial's processes, by pid
        self.session = Session(self, start=session)  # a trial's sandbox starts none

    # -- requests from the host

    def serve(self) -> None:
        while True:
            self.wait_for_request()
            frame = recv_frame(self.channel)
            if frame is None:
                return  # the host closed the sandbox: exiting as PID 1 kills everything in it
            send_pieces(self.channel, self.answer(frame))

    def wait_for_request(self) -> None:
        """Between requests a thread the model left running may still fault memory in, and
        without a cgroup nothing but us bounds it: we keep looking, and past the limit end the
        session (a fresh interpreter waits, and the next cell says why)."""
        if not self.memory.looks:
            return
        while not readable([self.channel], self.memory.until_look()):
            if self.memory.over():
                self.session.restart()
                self.session.lost = f"used more than its {self.limits.memory_mb} MiB of memory"

    def answer(self, frame: bytes) -> list:
        """The reply to one host request, as pieces of one frame (a tensor's bytes are not copied).

        Requests are typed (REQUESTS); none is parsed out of a command string, so a model's shell
        command is only ever a shell command. Where the harness ends and the model begins: every
        exception from handling model data is caught where it happens and becomes the model's
        answer (a shell's error, a cell's traceback, an invalid result); one that reaches here is a
        failure of the supervisor's own machinery, and the host sees it as a harness fault."""
        request = json.loads(frame)
        try:
            op, timeout = request["op"], float(request["timeout"])
            if op not in REQUESTS or set(request) != {"id", "op", "timeout", *REQUESTS[op]}:
                raise ValueError(f"malformed request: op {op!r} with fields {sorted(request)}")
            pieces = self.handle(op, request, timeout)
            if self.owns_pid_namespace:
                self.sweep()
        except Exception as e:  # a bug here must reach the host as an error, not as silence
            reply = {"error": f"the sandbox supervisor failed: {type(e).__name__}: {e}"}
            pieces = [json.dumps(reply).encode()]
        # The id goes first, before the reply's own opening brace: '{"id": 3, ' + '"reply": ...}'.
        head = json.dumps({"id": request.get("id")}).encode()[:-1] + b", "
        return [head, pieces[0][1:], *pieces[1:]]

    def handle(self, op: str, request: dict, timeout: float) -> list:
        """The reply's pieces. Nothing here runs past `timeout`, the host's wait for the request."""
        limit = min(timeout, self.limits.cell_timeout)
        if op == "shell":
            reply = shell.run(self, request["command"], request["cwd"] or SCRATCH, timeout)
        elif op == "run_cell":
            reply = self.session.run_cell(request["code"], limit)
        elif op == "preload":
            reply = self.session.preload(request["inputs"], limit)
        elif op == "end_session":
            self.session.end()
            reply = {"status": "ok"}
        elif op == "trial":
            return trial.run(self, trial_of(request, timeout, self.limits))
        else:
            doc, data = self.session.read_result(limit)
            if data:
                head, tail = json.dumps({"reply": doc}).encode().split(b'"data": ""')
                return [head + b'"data": "', data, b'"' + tail]
            reply = doc
        return [json.dumps({"reply": reply}).encode()]

    # -- the model's processes

    def fork_model_process(self, control: socket.socket, keep: set[int], exit_code: int, run) -> int:
        """Fork a child of the model's (the interpreter, a caller): it drops our ends of the host's
        channel and of its own, enters the model's side with only `keep` open, runs `run` and
        exits with `exit_code`. Returns its pid."""
        pid = os.fork()
        if pid == 0:
            try:
                os.close(self.channel.detach())
                os.close(control.detach())
                self.enter_model_side(SCRATCH)
                close_fds_except(keep)
                run()
            finally:
                os._exit(exit_code)
        return pid

    def enter_model_side(self, cwd: str) -> None:
        """In a child, before it runs anything of the model's: the model's cgroup and uid, its limits."""
        if self.cgroup:
            cgroups.join(self.cgroup)
            for fd in self.cgroup.values():
                os.close(fd)
        elif self.owns_pid_namespace:
            # Below us in the sandbox's autogroup (its CPU share without a cgroup; other sandboxes
            # do not see the difference): 64 busy processes of the model's would otherwise get 64
            # times our CPU, and a look at the memory would take 65 times as long.
            os.setpriority(os.PRIO_PROCESS, 0, MODEL_NICE)
        if self.model is not None:
            become_model(self.model, self.limits)
        resource.setrlimit(resource.RLIMIT_CPU, self.cpu_limit)
        os.chdir(cwd)

    def death(self, process: ModelProcess) -> str | None:
        """Why a process of the model's (the interpreter, a caller) is gone, or None while it lives."""
        if not readable([process.pidfd], 0):
            return None
        self.reap()
        if self.memory.over(now=True):
            return f"used more than its {self.limits.memory_mb} MiB of memory"
        return describe(process.status) if process.status is not None else "ended"

    def ask(self, process: ModelProcess, request: dict | None, limit: float, cap: int,
            capture: tuple[Capture, Capture] | None):
        """Send a request (None: send nothing) to a process of the model's and wait for the reply,
        all within limit + grace; returns (reply | None, why there is none: None when the time ran out)."""
        deadline = time.monotonic() + limit + self.limits.grace
        try:
            process.control.settimeout(limit + self.limits.grace)  # a wedged interpreter must not wedge us
            if request is not None:
                send_frame(process.control, json.dumps(request).encode())
        except TimeoutError:
            return None, None
        except OSError:
            return None, "closed its control channel"
        finally:
            process.control.settimeout(None)
        watch = [process.control, process.pidfd, self.channel]
        streams = dict(zip((process.out, process.err), capture)) if capture else {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, None
            open_streams, pace = paced(streams, MEMORY_POLL)
            ready = readable(watch + open_streams, min(left, self.memory.until_look(), pace))
            self.exit_if_deleted(ready)
            for fd, sink in streams.items():
                read_paced(fd, sink)
            if process.control in ready:
                try:
                    frame = recv_frame(process.control, cap, deadline)
                except TimeoutError:
                    return None, "did not finish its reply within the time limit"
                except ValueError:
                    return None, "sent an oversized reply"
                except OSError:
                    frame = None
                if frame is not None:
                    return frame, None
                # A dying process closes its sockets before it is done exiting: wait a moment.
                readable([process.pidfd], 1.0)
                return None, self.death(process) or "closed its control channel"
            if process.pidfd in ready:
                return None, self.death(process) or "ended"
            if self.memory.over():
                return None, f"used more than its {self.limits.memory_mb} MiB of memory"

    def exit_if_deleted(self, ready: list) -> None:
        if self.channel in ready and not self.channel.recv(1, socket.MSG_PEEK):
            os._exit(0)  # the host deleted the sandbox mid-request

    def sweep(self) -> None:
        """Kill every process but us and the interpreter: what a cell or a command started (a
        background job, a fork bomb) does not outlive it."""
        keep = {os.getpid(), *([self.session.interpreter.pid] if self.session.interpreter else [])}
        for _ in range(100):
            others = [pid for pid in live_pids() if pid not in keep]
            if not others:
                return
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.reap()  # orphans are ours; the interpreter reaps its own children

    def reap(self) -> None:
        """As PID 1 we inherit every orphan: reap them all, remembering how the interpreter and the
        callers ended."""
        for pid, status in exited_children():
            if self.session.interpreter and pid == self.session.interpreter.pid:
                self.session.interpreter.status = status
            elif pid in self.callers:
                self.callers[pid].status = status


def trial_of(request: dict, timeout: float, limits: Limits) -> trial.Trial:
    """A trial request, with its deadline: the host's wait less the trial's reserve (trial.py)."""
    return trial.Trial(source=request["source"], name=request["name"], inputs=request["inputs"],
                       cases=json.loads(request["cases"]), call_limit=float(request["call_limit"]),
                       allowlist=json.loads(request["allowlist"]), trace=request["trace"] is True,
                       deadline=time.monotonic() + timeout - trial.reserve(limits.grace),
                       loads_left=limits.cell_timeout, grace=limits.grace)


def serve(socket_path: str, limits: Limits) -> None:
    """In a container (Prime): one interpreter for the whole container, served on a unix socket to the
    `ptenv-request` client (ptenv/inside/prime_cli.py). The container is the isolation; inside it the
    model's interpreter and shells (`ptenv-request shell`) run as CONTAINER_MODEL_UID, we as root."""
    # Nothing outside deletes a container's interpreter: its channel is one whose other end we keep.
    _other_end, channel = socket.socketpair()
    # As root (a container's default) the model gets a uid of its own; the container's own memory
    # limit covers everything in it.
    model = ModelUser(CONTAINER_MODEL_UID) if has_capabilities(CAP_SETUID, CAP_SETGID) else None
    supervisor = Supervisor(channel, limits, model, owns_pid_namespace=False)
    server = socket.socket(socket.AF_UNIX)
    server.bind(socket_path + ".tmp")
    os.chmod(socket_path + ".tmp", 0o600)  # the host's requests only: the model's uid may not connect
    server.listen()
    os.rename(socket_path + ".tmp", socket_path)  # `test -S` sees it only once it listens
    while True:
        conn, _ = server.accept()
        with conn:
            frame = recv_frame(conn)
            if frame is not None:
                send_pieces(conn, supervisor.answer(frame))
