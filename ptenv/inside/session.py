"""The model's Python session, the supervisor's side: the interpreter process (interpreter.py) that
holds the session's variables, and the requests it serves: preload, run_cell, read_result, and
end_session. The session is restarted (a fresh interpreter, the inputs preloaded again) whenever
the interpreter dies, runs past its limit or answers out of protocol; once ended, the next request
starts a fresh one."""

import contextlib
import os
import signal
import socket
import time

from ptenv.inside.interpreter import Interpreter
from ptenv.inside.processes import ModelProcess, pids_of
from ptenv.inside.protocol import readable, recv_base64
from ptenv.inside.replies import INTERPRETER_BROKEN, SKELETON_CAP, cell_doc, cell_status, invalid, result_doc
from ptenv.inside.streams import Capture, read_available


class Session:
    def __init__(self, supervisor, start: bool):
        self.supervisor = supervisor
        self.limits = supervisor.limits
        self.inputs = "{}"  # encoded inputs as JSON text; every fresh interpreter preloads them
        self.lost = None  # why the session was ended between requests; the next cell says it
        self.interpreter: ModelProcess | None = None  # None while the session is ended
        if start:
            self.start()

    def ensure(self) -> str | None:
        """A live interpreter: a fresh one if the session was ended or the last one is gone (and
        then why it went)."""
        if self.interpreter is None:
            self.start()
            return None
        death = self.supervisor.death(self.interpreter)
        if death:
            self.restart()
        return death

    def start(self) -> None:
        control, child_end = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        on_model_side, on_model_side_w = os.pipe()
        # Closing on_model_side_w (it is not kept) says the child runs as the model. Exiting with
        # INTERPRETER_BROKEN says a cell broke the interpreter's own code (e.g. patched builtins).
        pid = self.supervisor.fork_model_process(
            control, {child_end.fileno(), out_w, err_w}, INTERPRETER_BROKEN,
            lambda: Interpreter(child_end, out_w, err_w, self.inputs, self.limits.output_bytes).serve())
        child_end.close()
        os.close(out_w)
        os.close(err_w)
        os.close(on_model_side_w)
        # Wait until the interpreter runs as the model (or is gone): until then the model's next
        # command could not see it, and a `kill -9 -1` sent right after a reset would miss it.
        readable([on_model_side], self.limits.cell_timeout)
        os.close(on_model_side)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.interpreter = ModelProcess(pid, control, os.pidfd_open(pid), out_r, err_r)

    def restart(self) -> None:
        """Kill everything in the sandbox but the supervisor, then fork a fresh interpreter with the inputs."""
        self.end()
        self.start()

    def end(self) -> None:
        """Kill the interpreter and everything the model started, and close our ends of its
        channels: as PID 1 of the sandbox, every other process in it; in a container, every process
        of the model's uid. Nothing the model left running outlives its session."""
        if self.interpreter is None:
            return
        if self.supervisor.owns_pid_namespace:
            kill_all(lambda: os.kill(-1, signal.SIGKILL), self.limits.grace)
        else:
            kill_all(self.kill_model_processes, self.limits.grace)
        self.interpreter.close()
        self.interpreter = None

    def kill_model_processes(self) -> None:
        """In a container: SIGKILL every process of the model's uid, or, where the model runs as we
        do, the interpreter's process group. ProcessLookupError once nothing is left."""
        if self.supervisor.model is None:
            os.killpg(self.interpreter.pid, signal.SIGKILL)
            return
        pids = pids_of(self.supervisor.model.uid)
        if not pids:
            raise ProcessLookupError
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def run_cell(self, code: str, limit: float) -> dict:
        death = self.ensure()  # it may have died between cells (e.g. the CPU limit)
        reset, self.lost = self.lost or death, None
        cap = self.limits.output_bytes
        out, err = Capture(cap), Capture(cap)
        request = {"op": "run_cell", "code": code, "limit": limit}
        frame, failure = self.supervisor.ask(self.interpreter, request, limit, 16 * cap, (out, err))
        for fd, sink in ((self.interpreter.out, out), (self.interpreter.err, err)):
            read_available(fd, sink)
        status, tb = cell_status(frame, cap)
        if status is None:
            if frame is None and failure is None:
                status, reset = "timeout", "ran past the time limit"
            else:
                status, reset = "reset", failure or "sent a malformed reply"
            self.restart()
        return cell_doc(status, out, err, tb, reset, limit)

    def preload(self, inputs: str, limit: float) -> dict:
        self.ensure()
        cap = self.limits.output_bytes
        frame, failure = self.supervisor.ask(self.interpreter, {"op": "preload", "inputs": inputs}, limit, cap, None)
        error = "" if frame == b"ok" else bytes(frame or b"").decode("utf-8", "replace")
        if frame is None:
            self.restart()
            error = f"preloading the inputs failed: the interpreter {failure or 'ran past the time limit'}"
        elif not error:
            self.inputs = inputs
        return cell_doc("error" if error else "ok", Capture(cap), Capture(cap), error[:cap], None, limit)

    def read_result(self, limit: float) -> tuple[dict, bytearray]:
        """The result's document and its tensor's bytes in base64. A reply costs what its skeleton
        declares, never more: the skeleton is capped small, and the tensor's bytes are read only as
        a frame of exactly the declared size (a valid read-back of N bytes costs 4N/3 and a piece)."""
        ended = self.interpreter is None
        if self.ensure() or ended:  # a fresh session has no result
            return {"status": "missing"}, bytearray()
        deadline = time.monotonic() + limit + self.limits.grace
        frame, failure = self.supervisor.ask(self.interpreter, {"op": "read_result"}, limit, SKELETON_CAP, None)
        if frame is None:
            return self.unreadable(failure or "ran past the time limit")
        doc, nbytes = result_doc(frame)
        if nbytes is None:
            self.restart()  # the rest of a forged reply may still be in the channel
        if doc["status"] != "ok":
            return doc, bytearray()
        try:
            data = recv_base64(self.interpreter.control, nbytes, deadline)
        except TimeoutError:
            return self.unreadable("did not finish its reply within the time limit")
        except ValueError:
            return self.unreadable("sent the tensor's bytes in a frame of another size than it declared")
        except OSError:
            data = None
        return (doc, data) if data is not None else self.unreadable("closed its control channel")

    def unreadable(self, failure: str) -> tuple[dict, bytearray]:
        self.restart()  # it may have left the channel mid-frame
        return invalid(f"reading result failed: the interpreter {failure}"), bytearray()


def kill_all(kill, grace: float) -> None:
    """Call `kill` until it finds nothing left to kill (ProcessLookupError), reaping what it killed
    between rounds: a fork bomb may need a few. Every wait has a bound: a D-state child is reaped later."""
    deadline = time.monotonic() + grace
    for _ in range(100):
        try:
            kill()
        except ProcessLookupError:
            return
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
