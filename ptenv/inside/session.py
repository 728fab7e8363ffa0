"""The model's Python session, the supervisor's side: the interpreter process (interpreter.py) that
holds the session's variables, and the three requests it serves: preload, run_cell, read_result.
The session is restarted (a fresh interpreter, the inputs preloaded again) whenever the
interpreter dies, runs past its limit or answers out of protocol."""

import os
import select
import signal
import socket
import time

from ptenv.inside.interpreter import Interpreter
from ptenv.inside.processes import ModelProcess
from ptenv.inside.protocol import recv_base64
from ptenv.inside.replies import INTERPRETER_BROKEN, SKELETON_CAP, cell_doc, cell_status, invalid, result_doc
from ptenv.inside.streams import Capture, read_available


class Session:
    def __init__(self, supervisor):
        self.supervisor = supervisor
        self.limits = supervisor.limits
        self.inputs = "{}"  # encoded inputs as JSON text; every fresh interpreter preloads them
        self.lost = None  # why the session was ended between requests; the next cell says it
        self.interpreter: ModelProcess | None = None
        self.start()

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
        select.select([on_model_side], [], [], self.limits.cell_timeout)
        os.close(on_model_side)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.interpreter = ModelProcess(pid, control, os.pidfd_open(pid), out_r, err_r)

    def restart(self) -> None:
        """Kill everything in the sandbox but the supervisor, then fork a fresh interpreter with the inputs."""
        self.end()
        self.start()

    def end(self) -> None:
        """Kill the interpreter and everything the model started (in a container: the interpreter's
        process group), and close our ends of its channels."""
        target = -1 if self.supervisor.owns_pid_namespace else -self.interpreter.pid
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
        self.interpreter.close()

    def run_cell(self, code: str, limit: float) -> dict:
        death = self.supervisor.death(self.interpreter)  # it may have died between cells (e.g. the CPU limit)
        if death:
            self.restart()
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
        if self.supervisor.death(self.interpreter):
            self.restart()
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
        if self.supervisor.death(self.interpreter):
            self.restart()
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
