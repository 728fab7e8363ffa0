"""The supervisor: the harness inside a sandbox. It serves the host's commands, owns the interpreter
and the shells, and enforces the sandbox's limits.

Locally it is PID 1 of the sandbox's own PID namespace, running as a uid of its own, while
everything it starts runs as the model's uid (isolation.py). In a container (Prime) it serves
the interpreter beside other processes and only ever kills what it started.

The rule it keeps: whatever the interpreter sends or fails to send (malformed, oversized, nested,
slow, silent or dead) is the model's answer and becomes a well-formed reply; only a failure of
the supervisor itself reaches the host as an error.
"""

import json
import os
import resource
import select
import signal
import socket
import subprocess
import time

from ptenv.inside import allowlist
from ptenv.inside import cgroups, codec, judge
from ptenv.inside.children import exited_children
from ptenv.inside.isolation import SCRATCH, ModelUser, become_model, close_fds_except
from ptenv.inside.syscalls import CAP_SETGID, CAP_SETUID, has_capabilities
from ptenv.inside.protocol import HIDDEN_OUTPUT_CAP, MAX_HIDDEN_OUTPUTS, Limits, cut_middle, model_text, one_line, recv_base64, recv_frame, send_frame, send_pieces
from ptenv.inside.interpreter import Interpreter

# Without a cgroup the supervisor looks at a sandbox's memory itself (over_memory), sooner the
# nearer it is to its limit: see next_look.
MEMORY_POLL = 0.2  # seconds between looks while it is far below its limit
MIN_POLL = 0.01  # seconds between looks however near it is
FAULT_RATE_KB = 6 << 20  # kB/s: the fastest a sandbox is taken to fault memory in (4.4 GiB/s measured, bench/bench_memory.py)
FAULT_KB = 64  # the most one page fault maps without huge pages: the kernel's fault-around, 64 KiB
MODEL_NICE = 19  # the model's processes' nice value without a cgroup (enter_model_side)
PACE = 0.004  # seconds between reads of a stream past its cap: 64 KiB each, 16 MiB/s
INTERPRETER_BROKEN = 70
CONTAINER_MODEL_UID = 1_000_000  # the model's uid in a container we run as root in (no passwd entry)
SKELETON_CAP = 64 * 1024  # a result reply without its tensor bytes: dtype, shape, status, reason
MAX_CONTAINERS = 256  # JSON arrays and objects in that skeleton: a tensor's shape has at most 64


def describe(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code == INTERPRETER_BROKEN:
        return "broke (a cell damaged the code that runs cells)"
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name
    return f"was killed by {name}" + (" (the CPU time limit)" if name == "SIGXCPU" else "")


class Capture:
    """Keeps the first `cap` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.head = bytearray()
        self.total = 0
        self.next_read = 0.0  # past the cap, the stream is paced (read_available)

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += data[:room]

    def text(self) -> str:
        return self.head.decode("utf-8", "replace")

    def with_notice(self) -> str:
        return self.text() + f"\n[... {self.cut} more bytes cut]" if self.cut else self.text()

    @property
    def cut(self) -> int:
        return self.total - len(self.head)


def read_available(fd: int, sink: Capture, blocks: int = 64) -> None:
    """Read what is in a non-blocking pipe now; bounded, as a background writer may never stop."""
    for _ in range(blocks):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        sink.feed(data)


def read_paced(fd: int, sink: Capture) -> None:
    """read_available while a command runs. Past its cap a stream is only counted, so it is read
    one block per PACE: a flood's writer then waits on the full pipe instead of spending CPU, its
    own and its supervisor's (F11)."""
    if time.monotonic() < sink.next_read:
        return
    read_available(fd, sink, 1 if sink.cut else 64)
    if sink.cut:
        sink.next_read = time.monotonic() + PACE


def paced(streams: dict[int, Capture]) -> tuple[list[int], float]:
    """The streams to wait on now, and how soon a paced one may be read again."""
    now = time.monotonic()
    waits = [sink.next_read - now for sink in streams.values() if sink.next_read > now]
    return [fd for fd, sink in streams.items() if sink.next_read <= now], min(waits, default=MEMORY_POLL)


def next_look(headroom_kb: float) -> float:
    """Seconds until the next look at a sandbox's memory: as long as its headroom lasts at
    FAULT_RATE_KB, between MIN_POLL and MEMORY_POLL. So a burst no faster than that passes the
    limit by at most what it faults in during MIN_POLL and three looks (docs/sandbox.md), and a
    sandbox far below its limit is looked at every MEMORY_POLL, as before."""
    return min(MEMORY_POLL, max(MIN_POLL, headroom_kb / FAULT_RATE_KB))


def live_processes() -> dict[tuple[int, int], int]:
    """The processes of this sandbox that are not zombies (this /proc shows only our namespace), by
    (pid, start time), each with its page faults so far."""
    processes = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if fields[0] != b"Z":  # fields from the state on: minflt, majflt, starttime
                    processes[int(name), int(fields[19])] = int(fields[7]) + int(fields[9])
            except (OSError, IndexError, ValueError):
                continue
    return processes


def live_pids() -> list[int]:
    return [pid for pid, _ in live_processes()]


def pss_kb(pid: int) -> int:
    """A process's proportional share of memory (shared pages divided among their users). The
    kernel walks its page tables for it: tens of ms for a GiB of small pages."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration, ValueError):
        return 0  # gone meanwhile


def socket_count() -> int:
    """The sockets of the sandbox's own network namespace, of every family. The kernel counts them
    per namespace (/proc/net/sockstat), so this costs no walk of its socket tables (reading
    /proc/net/tcp walks the whole host's: ~9 ms on the machine of docs/benchmarks.md)."""
    with open("/proc/net/sockstat") as f:
        return next(int(line.split()[2]) for line in f if line.startswith("sockets:"))


def socket_buffer_kb() -> int:
    """The most a socket's buffers can hold: twice the largest size a process may ask for."""
    sizes = []
    for name in ("wmem_max", "rmem_max"):
        with open(f"/proc/sys/net/core/{name}") as f:
            sizes.append(int(f.read()))
    return 2 * max(sizes) // 1024


def cell_doc(status, out: Capture, err: Capture, tb: str, reset, limit) -> dict:
    """What a cell (or a preload) answers with; `reset` says why variables were lost."""
    return {
        "status": status,
        "stdout": out.text(),
        "stderr": err.text() + tb,
        "stdout_cut": out.cut,
        "stderr_cut": err.cut,
        "reset": reset,
        "limit": limit,
    }


def bounded_loads(data):
    """JSON from the model's process, parsed only when its nesting cannot cost memory out of
    proportion to its size (a reply of `[[[[]]]],...` would); None when it is not such JSON."""
    if data.count(b"[") + data.count(b"{") > MAX_CONTAINERS:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError):
        return None


def cell_status(frame, tb_cap: int) -> tuple[str | None, str]:
    """(status, traceback) from the interpreter's reply to a cell; (None, "") if it is not one."""
    reply = bounded_loads(frame) if frame is not None else None
    if not isinstance(reply, dict):
        return None, ""
    status, tb = reply.get("status"), reply.get("traceback")
    if status not in ("ok", "error", "timeout") or not isinstance(tb, str):
        return None, ""
    return status, cut_middle(model_text(tb), tb_cap)


def result_doc(frame: bytearray) -> tuple[dict, int | None]:
    """The interpreter's reply to `result`, rebuilt from its parts: well formed and bounded whatever
    the model sent; and, when it is a tensor, the byte count of the frame of raw bytes that follows.
    The count is None for a reply the interpreter's code never sends: more of it may follow."""
    doc = bounded_loads(frame)
    if doc is None:
        return invalid("the interpreter's reply to `result` is not JSON of a result's size and depth"), None
    status = doc.get("status") if isinstance(doc, dict) else None
    if status == "missing":
        return {"status": "missing"}, 0
    if status == "invalid" and isinstance(doc.get("reason"), str):
        return invalid(doc["reason"]), 0
    tensor = doc.get("result") if status == "ok" else None
    if not isinstance(tensor, dict) or set(tensor) != {"dtype", "shape"}:
        return invalid("the interpreter's reply to `result` is malformed"), None
    try:
        nbytes = codec.byte_count(tensor["dtype"], tensor["shape"])
    except codec.CodecError as e:
        return invalid(f"the interpreter's reply to `result` is malformed: {e}"), None
    return {"status": "ok", "result": {"dtype": tensor["dtype"], "shape": tensor["shape"], "data": ""}}, nbytes


def invalid(reason: str) -> dict:
    return {"status": "invalid", "reason": model_text(one_line(reason, 200))}


# Each request's fields besides id, op and timeout.
REQUESTS = {"sh": ("command", "cwd"), "exec": ("code",), "preload": ("inputs",), "result": (),
            "hidden": ("source", "name", "cases", "call_limit", "ban")}


class Supervisor:
    """Serves the commands for one sandbox; owns the interpreter and the shells."""

    def __init__(self, channel: socket.socket, limits: Limits, model: ModelUser | None,
                 cgroup: dict[str, int] | None = None, owns_pid_namespace: bool = True):
        self.channel = channel  # its end means the sandbox was deleted
        self.limits = limits
        self.model = model  # None in a container we do not run as root in: the model runs as we do
        self.cgroup = cgroup  # fds of the model's cgroup (cgroups.py), or None: we poll memory ourselves
        self.owns_pid_namespace = owns_pid_namespace  # False in a container: we are not its PID 1
        # Without a cgroup, in a sandbox of our own, nothing but our looks bounds its memory.
        self.looks_at_memory = not cgroup and owns_pid_namespace
        self.next_memory_check = 0.0  # when over_memory looks next (without a cgroup)
        self.walked = None  # ({process: faults}, their PSS sum in kB) when it was last summed
        self.lost = None  # why the session was ended between requests; the next cell says it
        self.oom_kills = cgroups.oom_kills(cgroup) if cgroup else 0
        # Without a cgroup, socket buffers are in no process's PSS: each socket counts as full.
        self.socket_kb = socket_buffer_kb() if self.looks_at_memory else 0
        cpu = max(1, round(limits.cpu_per_cell_limit * limits.cell_timeout))
        self.cpu_limit = (cpu, cpu + 5)  # past the soft limit SIGXCPU, past the hard one SIGKILL
        self.env = dict(os.environ)
        self.inputs = "{}"  # encoded inputs as JSON text; every fresh interpreter loads them
        self.interpreter = None
        self.judges: dict[int, dict] = {}  # a function task's hidden-phase processes, by pid
        self.start_interpreter()

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
        if not self.looks_at_memory:
            return
        while not select.select([self.channel], [], [], self.until_look())[0]:
            if self.over_memory():
                self.restart_interpreter()
                self.lost = f"used more than its {self.limits.memory_mb} MiB of memory"

    def answer(self, frame: bytes) -> list:
        """The reply to one host request, as pieces of one frame (a tensor's bytes are not copied).

        Requests are typed (REQUESTS); none is parsed out of a command string, so a model's shell
        command is only ever a shell command. Where the harness ends and the model begins: every
        exception from handling model data is caught where it happens and becomes the model's
        answer (a shell's error, a cell's traceback, an invalid result); one that reaches here is a
        failure of the supervisor's own machinery, and the host sees it as a harness error."""
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
        # The id goes first, before the reply's own opening brace: '{"id": 3, ' + '"op": ...}'.
        head = json.dumps({"id": request.get("id")}).encode()[:-1] + b", "
        return [head, pieces[0][1:], *pieces[1:]]

    def handle(self, op: str, request: dict, timeout: float) -> list:
        """Nothing here runs past `timeout`, the host's wait for the request."""
        limit = min(timeout, self.limits.cell_timeout)
        if op == "sh":
            return [json.dumps(self.shell(request["command"], request["cwd"] or SCRATCH, timeout)).encode()]
        if op == "exec":
            return [json.dumps({"cell": self.exec_cell(request["code"], limit)}).encode()]
        if op == "preload":
            return [json.dumps({"cell": self.preload(request["inputs"], limit)}).encode()]
        if op == "hidden":
            cases, ban = json.loads(request["cases"]), json.loads(request["ban"])
            report = self.hidden(request["source"], request["name"], cases, float(request["call_limit"]), ban, limit)
            return [json.dumps({"hidden": report}).encode()]
        doc, data = self.read_result(limit)
        if not data:
            return [json.dumps({"result": doc}).encode()]
        head, tail = json.dumps({"result": doc}).encode().split(b'"data": ""')
        return [head + b'"data": "', data, b'"' + tail]

    # -- the interpreter

    def start_interpreter(self) -> None:
        control, child_end = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        on_model_side, on_model_side_w = os.pipe()
        # Closing on_model_side_w (it is not kept) says the child runs as the model. Exiting with
        # INTERPRETER_BROKEN says a cell broke the interpreter's own code (e.g. patched builtins).
        pid = self.fork_model_process(
            control, {child_end.fileno(), out_w, err_w}, INTERPRETER_BROKEN,
            lambda: Interpreter(child_end, out_w, err_w, self.inputs, self.limits.output_bytes).serve())
        child_end.close()
        os.close(out_w)
        os.close(err_w)
        os.close(on_model_side_w)
        # Wait until the interpreter runs as the model (or is gone): until then the model's next
        # command could not see it, and a `kill -9 -1` sent right after a reset would miss it.
        select.select([on_model_side], [], [], self.limits.cell_timeout)
        os.close(on_model_side)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.interpreter = {
            "pid": pid, "status": None, "control": control, "out": out_r, "err": err_r, "pidfd": os.pidfd_open(pid)
        }

    def fork_model_process(self, control: socket.socket, keep: set[int], exit_code: int, run) -> int:
        """Fork a child of the model's (the interpreter, a judge): it drops our ends of the host's
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

    def restart_interpreter(self) -> None:
        """Kill everything in the sandbox but us, then fork a fresh interpreter with the inputs."""
        self.end_session()
        self.start_interpreter()

    def end_session(self) -> None:
        """Kill the interpreter and everything the model started (in a container: the interpreter's
        process group), and close our ends of its channels."""
        s = self.interpreter
        target = -1 if self.owns_pid_namespace else -s["pid"]
        deadline = time.monotonic() + self.limits.grace
        for _ in range(100):  # a fork bomb may need a few rounds
            try:
                # The interpreter leads its own process group; as PID 1 we may kill everything else.
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                break
            while time.monotonic() < deadline:  # every wait has a bound: a D-state child is reaped later
                try:
                    pid, _ = os.waitpid(target, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    time.sleep(0.01)
        s["control"].close()
        for fd in (s["out"], s["err"], s["pidfd"]):
            os.close(fd)

    def interpreter_death(self) -> str | None:
        """Why the interpreter is gone, or None while it lives."""
        return self.death(self.interpreter)

    def death(self, s: dict) -> str | None:
        """Why a process of the model's (the interpreter, a judge) is gone, or None while it lives."""
        if not select.select([s["pidfd"]], [], [], 0)[0]:
            return None
        self.reap()
        if self.over_memory(now=True):
            return f"used more than its {self.limits.memory_mb} MiB of memory"
        return describe(s["status"]) if s["status"] is not None else "ended"

    def ask_interpreter(self, request: dict, limit: float, cap: int, capture: tuple[Capture, Capture] | None):
        return self.ask(self.interpreter, request, limit, cap, capture)

    def ask(self, s: dict, request: dict | None, limit: float, cap: int, capture: tuple[Capture, Capture] | None):
        """Send a request (None: send nothing) to a process of the model's and wait for the reply,
        all within limit + grace; returns (reply | None, why there is none: None when the time ran out)."""
        deadline = time.monotonic() + limit + self.limits.grace
        try:
            s["control"].settimeout(limit + self.limits.grace)  # a wedged interpreter must not wedge us
            if request is not None:
                send_frame(s["control"], json.dumps(request).encode())
        except TimeoutError:
            return None, None
        except OSError:
            return None, "closed its control channel"
        finally:
            s["control"].settimeout(None)
        watch = [s["control"], s["pidfd"], self.channel]
        streams = dict(zip((s["out"], s["err"]), capture)) if capture else {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, None
            readable, pace = paced(streams)
            ready, _, _ = select.select(watch + readable, [], [], min(left, self.until_look(), pace))
            self.exit_if_deleted(ready)
            for fd, sink in streams.items():
                read_paced(fd, sink)
            if s["control"] in ready:
                try:
                    frame = recv_frame(s["control"], cap, deadline)
                except TimeoutError:
                    return None, "did not finish its reply within the time limit"
                except ValueError:
                    return None, "sent an oversized reply"
                except OSError:
                    frame = None
                if frame is not None:
                    return frame, None
                # A dying process closes its sockets before it is done exiting: wait a moment.
                select.select([s["pidfd"]], [], [], 1.0)
                return None, self.death(s) or "closed its control channel"
            if s["pidfd"] in ready:
                return None, self.death(s) or "ended"
            if self.over_memory():
                return None, f"used more than its {self.limits.memory_mb} MiB of memory"

    def until_look(self) -> float:
        """How long a wait may last before it must call over_memory."""
        if not self.looks_at_memory:
            return MEMORY_POLL  # the cgroup's OOM kill count, or nothing to look at: a steady pace
        return max(0.0, self.next_memory_check - time.monotonic())

    def exit_if_deleted(self, ready: list) -> None:
        if self.channel in ready and not self.channel.recv(1, socket.MSG_PEEK):
            os._exit(0)  # the host deleted the sandbox mid-command

    def over_memory(self, now: bool = False) -> bool:
        """Whether the model's processes went past the memory limit. With a cgroup the kernel
        enforces it and we look at its count of OOM kills. Otherwise we look when the last look
        said to (next_look; `now`: at once), at the sum of the processes' PSS (shared pages
        counted once) and the most their sockets' buffers can hold."""
        if self.cgroup:
            kills = cgroups.oom_kills(self.cgroup)
            over, self.oom_kills = kills > self.oom_kills, kills
            return over
        start = time.monotonic()
        if not self.looks_at_memory or (start < self.next_memory_check and not now):
            return False
        limit_kb = self.limits.memory_mb * 1024
        sockets_kb = self.socket_kb * socket_count()
        used_kb = sockets_kb + self.pss_bound(limit_kb - sockets_kb)
        end = time.monotonic()
        # At most half our time goes to looking: the model's processes, below us in their autogroup
        # (enter_model_side), would otherwise barely run while their sandbox is near its limit.
        self.next_memory_check = end + max(next_look(limit_kb - used_kb), end - start)
        return used_kb > limit_kb

    def pss_bound(self, room_kb: int) -> int:
        """At least the PSS sum of the model's processes, in kB, and the sum itself when it may be
        over `room_kb`. The sum walks every page table (up to tens of ms), so it is taken again only
        then; till then the last sum and FAULT_KB per page fault since bound it, as no page comes
        in without a fault, and no fault brings more (the model's processes have no huge pages,
        isolation.py; a fork adds none). The walk stops once the sum is past `room_kb`."""
        faults = {p: n for p, n in live_processes().items() if p[0] != os.getpid()}
        if self.walked is not None:
            before, walked_kb = self.walked
            bound = walked_kb + FAULT_KB * sum(max(0, n - before.get(p, 0)) for p, n in faults.items())
            if bound <= room_kb:
                return bound
        total = 0
        for pid, _ in faults:
            total += pss_kb(pid)
            if total > room_kb:
                self.walked = None  # a part of the sum: the next look walks again
                return total
        self.walked = (faults, total)
        return total

    def drain(self, capture: tuple[Capture, Capture]) -> None:
        for fd, sink in zip((self.interpreter["out"], self.interpreter["err"]), capture):
            read_available(fd, sink)

    def exec_cell(self, code: str, limit: float) -> dict:
        death = self.interpreter_death()  # it may have died between cells (e.g. the CPU limit)
        if death:
            self.restart_interpreter()
        reset, self.lost = self.lost or death, None
        cap = self.limits.output_bytes
        out, err = Capture(cap), Capture(cap)
        request = {"op": "exec", "code": code, "limit": limit}
        frame, failure = self.ask_interpreter(request, limit, 16 * cap, (out, err))
        self.drain((out, err))
        status, tb = cell_status(frame, cap)
        if status is None:
            if frame is None and failure is None:
                status, reset = "timeout", "ran past the time limit"
            else:
                status, reset = "reset", failure or "sent a malformed reply"
            self.restart_interpreter()
        return cell_doc(status, out, err, tb, reset, limit)

    def preload(self, inputs: str, limit: float) -> dict:
        if self.interpreter_death():
            self.restart_interpreter()
        cap = self.limits.output_bytes
        frame, failure = self.ask_interpreter({"op": "load", "inputs": inputs}, limit, cap, None)
        error = "" if frame == b"ok" else bytes(frame or b"").decode("utf-8", "replace")
        if frame is None:
            self.restart_interpreter()
            error = f"loading the inputs failed: the interpreter {failure or 'ran past the time limit'}"
        elif not error:
            self.inputs = inputs
        return cell_doc("error" if error else "ok", Capture(cap), Capture(cap), error[:cap], None, limit)

    def read_result(self, limit: float) -> tuple[dict, bytearray]:
        """The result's document and its tensor's bytes in base64. A reply costs what its skeleton
        declares, never more: the skeleton is capped small, and the tensor's bytes are read only as
        a frame of exactly the declared size (a valid read-back of N bytes costs 4N/3 and a piece)."""
        if self.interpreter_death():
            self.restart_interpreter()
            return {"status": "missing"}, bytearray()
        deadline = time.monotonic() + limit + self.limits.grace
        frame, failure = self.ask_interpreter({"op": "result"}, limit, SKELETON_CAP, None)
        if frame is None:
            return self.unreadable(failure or "ran past the time limit")
        doc, nbytes = result_doc(frame)
        if nbytes is None:
            self.restart_interpreter()  # the rest of a forged reply may still be in the channel
        if doc["status"] != "ok":
            return doc, bytearray()
        try:
            data = recv_base64(self.interpreter["control"], nbytes, deadline)
        except TimeoutError:
            return self.unreadable("did not finish its reply within the time limit")
        except ValueError:
            return self.unreadable("sent the tensor's bytes in a frame of another size than it declared")
        except OSError:
            data = None
        return (doc, data) if data is not None else self.unreadable("closed its control channel")

    def unreadable(self, failure: str) -> tuple[dict, bytearray]:
        self.restart_interpreter()  # it may have left the channel mid-frame
        return invalid(f"reading result failed: the interpreter {failure}"), bytearray()

    # -- a function task's hidden phase

    def hidden(self, source: str, name: str, cases: list, call_limit: float, ban: dict | None, limit: float) -> dict:
        """Run the answer's function on each hidden case in a judge (judge.py), under the allowlist
        if any ({"allow", "autograd"}, allowlist.py), each call within `call_limit`: {"load": why the answer
        could not be loaded or None, "protected": whether the judge could not start processes,
        "cases": one report per case}. A judge that times out, dies or answers out of protocol is
        killed, that case is the model's failure, and a fresh judge takes the next case."""
        # Nothing the model left running may watch or touch the judges: the session is over.
        self.end_session()
        reports, process, load, protected = [], None, None, True
        for case in cases:
            if reports and reports[-1]["status"] == "timeout":
                # One time-out ends the phase: a hung answer costs one call's limit, not N of them.
                reports.append({"status": "timeout", "reason": "not run: an earlier case ran past its limit"})
                continue
            if process is None:
                process, load, protected = self.start_judge(source, name, ban, limit)
                if load is not None:
                    break
            report = self.judge_call(process, case, call_limit, ban is not None)
            reports.append(report)
            if report["status"] in ("timeout", "died"):
                self.stop_judge(process)
                process = None
        if process is not None:
            self.stop_judge(process)
        self.start_interpreter()  # a fresh session, so the sandbox still answers as before
        return {"load": load, "protected": protected, "cases": reports}

    def start_judge(self, source: str, name: str, ban: dict | None, limit: float) -> tuple[dict | None, str | None, bool]:
        """Fork a judge from this process (torch imported, not the model's session); wait for it to
        load the answer: (judge, why it could not or None, whether it could not start processes)."""
        control, child_end = socket.socketpair()

        def run() -> None:
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.setpgid(0, 0)
            judge.serve(child_end, self.inputs, source, name, ban)

        pid = self.fork_model_process(control, {child_end.fileno()}, 0, run)
        child_end.close()
        s = {"pid": pid, "status": None, "control": control, "pidfd": os.pidfd_open(pid)}
        self.judges[pid] = s
        frame, failure = self.ask(s, None, limit, SKELETON_CAP, None)
        ready = bounded_loads(frame) if frame is not None else None
        if isinstance(ready, dict) and ready.get("status") == "ready":
            return s, None, ready.get("protected") is True
        if isinstance(ready, dict) and ready.get("status") == "ban_failed":  # before the answer ran
            self.stop_judge(s)
            raise RuntimeError(f"the ban could not be installed: {ready.get('reason')}")
        if isinstance(ready, dict) and ready.get("status") == "error" and isinstance(ready.get("reason"), str):
            why = ready["reason"]
        else:
            why = f"the process loading it {failure or 'ran past the time limit'}" if frame is None \
                else "the process loading it sent a malformed reply"
        self.stop_judge(s)
        return None, model_text(one_line(why, 300)), True  # no case ran: nothing was less protected

    def judge_call(self, s: dict, case: dict, call_limit: float, banned: bool) -> dict:
        """One hidden call's report: ok with the outputs, or error, invalid, timeout or died with a reason."""
        frame, failure = self.ask(s, case, call_limit, SKELETON_CAP, None)
        if frame is None:
            if failure is None:
                return {"status": "timeout", "reason": f"ran past the {call_limit:g} s limit"}
            code = os.waitstatus_to_exitcode(s["status"]) if banned and s["status"] is not None else 0
            if code in allowlist.TRAPS or -code == signal.SIGSEGV:
                why = allowlist.TRAPS.get(code, allowlist.OTHER_CODE)
                return {"status": "died", "reason": f"not on the allowlist: the function {why}"}
            return {"status": "died", "reason": model_text(one_line(failure, 200))}
        head = bounded_loads(frame)
        status = head.get("status") if isinstance(head, dict) else None
        if status == "error" and isinstance(head.get("reason"), str):
            return {"status": "error", "reason": model_text(one_line(head["reason"], 300))}
        count = head.get("count") if status == "ok" else None
        if type(count) is not int or not 1 <= count <= MAX_HIDDEN_OUTPUTS:
            return {"status": "died", "reason": "the function's process sent a malformed reply"}
        outputs, deadline = [], time.monotonic() + call_limit + self.limits.grace
        for _ in range(count):
            try:
                output = self.judge_output(s, deadline)
            except TimeoutError:
                return {"status": "timeout", "reason": f"ran past the {call_limit:g} s limit"}
            except (ValueError, OSError):
                return {"status": "died", "reason": "the function's process sent a malformed reply"}
            if output.get("status") == "invalid":
                return {"status": "died", "reason": output["reason"]}
            outputs.append(output)
        return {"status": "ok", "outputs": outputs}

    @staticmethod
    def judge_output(s: dict, deadline: float) -> dict:
        """One output of a call, sent as the interpreter sends `result` (skeleton, then bytes), as
        an encoded tensor; an invalid document if it is not one or is over the cap."""
        frame = recv_frame(s["control"], SKELETON_CAP, deadline)
        doc, nbytes = result_doc(frame) if frame is not None else (invalid("the reply ended early"), 0)
        if doc["status"] != "ok":
            return invalid(doc.get("reason", "an output is missing"))
        if (nbytes + 2) // 3 * 4 > HIDDEN_OUTPUT_CAP:
            return invalid(f"an output is over the {HIDDEN_OUTPUT_CAP}-byte cap")
        data = recv_base64(s["control"], nbytes, deadline)
        if data is None:
            return invalid("the reply ended early")
        return {**doc["result"], "data": data.decode("ascii")}

    def stop_judge(self, s: dict) -> None:
        """Kill a judge (and, where seccomp could not stop it, what it started: its process group)."""
        for kill in (lambda: signal.pidfd_send_signal(s["pidfd"], signal.SIGKILL), lambda: os.killpg(s["pid"], signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        select.select([s["pidfd"]], [], [], self.limits.grace)  # bounded: a D-state judge is reaped later
        self.reap()
        s["control"].close()
        os.close(s["pidfd"])
        self.judges.pop(s["pid"], None)

    # -- shell commands

    def shell(self, command: str, cwd: str, timeout: float) -> dict:
        out, err = Capture(self.limits.output_bytes), Capture(self.limits.output_bytes)
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=self.env, process_group=0, preexec_fn=lambda: self.shell_child(cwd),
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
            readable, pace = paced(streams)
            ready, _, _ = select.select([pidfd, self.channel, *readable], [], [], min(max(left, 0), self.until_look(), pace))
            self.exit_if_deleted(ready)
            for fd, sink in streams.items():
                read_paced(fd, sink)
            over_memory = self.over_memory()
            if pidfd in ready or left <= 0 or over_memory:
                break
        for fd, sink in streams.items():
            read_available(fd, sink)  # what the shell wrote last
        timed_out = pidfd not in ready and not over_memory
        if over_memory:
            err.feed(f"\n[killed: the sandbox used more than its {self.limits.memory_mb} MiB of memory]\n".encode())
        if timed_out or over_memory:
            self.kill_command(process.pid, pidfd)
        # The command is over when the shell exits; a background job may keep the pipes open.
        # SIGKILL reaches the shell through its pidfd wherever it moved, so this wait is short; it
        # is bounded all the same, and a shell still there after it is reaped later (reap()).
        try:
            status = process.wait(self.limits.grace)
        except subprocess.TimeoutExpired:
            status, timed_out = None, True
        process.stdout.close()
        process.stderr.close()
        os.close(pidfd)
        if timed_out:
            return {"timed_out": True}
        return {"stdout": out.with_notice(), "stderr": err.with_notice(), "exit_code": status if status >= 0 else 128 - status}

    def shell_child(self, cwd: str) -> None:
        """In the shell's process, between fork and exec."""
        try:
            self.enter_model_side(cwd)
        except OSError as e:
            os.write(2, f"sh: cd: {cwd}: {e.strerror}\n".encode())
            os._exit(2)
        # At the sandbox's memory limit the kernel kills a shell's processes before the interpreter
        # (and the variables in it).
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a shell gets the usual defaults
            signal.signal(sig, signal.SIG_DFL)

    @staticmethod
    def kill_command(pid: int, pidfd: int) -> None:
        """Kill a shell command's processes: the shell itself through its pidfd (wherever it moved),
        and its process group. Where the sandbox's PID namespace is ours, the sweep after every
        request then kills what left the group."""
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def sweep(self) -> None:
        """Kill every process but us and the interpreter: what a cell or a command started (a
        background job, a fork bomb) does not outlive it."""
        keep = {os.getpid(), self.interpreter["pid"]}
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
        judges ended."""
        for pid, status in exited_children():
            if pid == self.interpreter["pid"]:
                self.interpreter["status"] = status
            elif pid in self.judges:
                self.judges[pid]["status"] = status


def serve(socket_path: str, limits: Limits) -> None:
    """In a container (Prime): one interpreter for the whole container, served on a unix socket to the
    `ptenv-session` client (ptenv/inside/prime_cli.py). The container is the isolation; inside it the
    model's interpreter and shells (`ptenv-session sh`) run as CONTAINER_MODEL_UID, we as root."""
    # Nothing outside deletes a container's interpreter: its channel is one whose other end we keep.
    _other_end, channel = socket.socketpair()
    # As root (a container's default) the model gets a uid of its own; the container's own memory
    # limit covers everything in it.
    model = ModelUser(CONTAINER_MODEL_UID) if has_capabilities(CAP_SETUID, CAP_SETGID) else None
    supervisor = Supervisor(channel, limits, model, owns_pid_namespace=False)
    server = socket.socket(socket.AF_UNIX)
    server.bind(socket_path + ".tmp")
    os.chmod(socket_path + ".tmp", 0o600)  # the host's commands only: the model's uid may not connect
    server.listen()
    os.rename(socket_path + ".tmp", socket_path)  # `test -S` sees it only once it listens
    while True:
        conn, _ = server.accept()
        with conn:
            frame = recv_frame(conn)
            if frame is not None:
                send_pieces(conn, supervisor.answer(frame))
