"""The interpreter: the process that runs the model's cells in one persistent namespace.

It is the model's. A cell may patch anything in this process, including the code below, so the
supervisor treats every reply from here as the model's answer: bounded, checked, and never a
harness failure when it is wrong.
"""

import ast
import json
import linecache
import os
import signal
import sys
import traceback

import torch

from ptenv.inside import codec
from ptenv.inside.children import exited_children
from ptenv.inside.protocol import cut_middle, recv_frame, send_frame, send_pieces
from ptenv.inside.namespace import new_namespace


class CellTimeout(BaseException):
    """Raised into a cell by SIGALRM; a BaseException so `except Exception` in a cell misses it."""


class Interpreter:
    """One persistent namespace. Model code runs here and may break anything in this process, so
    the replies use references taken before any cell ran, and the host checks them anyway."""

    def __init__(self, control, out_fd: int, err_fd: int, inputs: str, traceback_cap: int):
        self.control = control
        self.traceback_cap = traceback_cap
        self.out_fd, self.err_fd = out_fd, err_fd
        self.me = os.getpid()
        self.cells = 0
        self.running = False
        self.tensor_types = (torch.Tensor, torch.nn.Parameter)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.setpgid(0, 0)  # what the interpreter starts can be killed as one group
        signal.signal(signal.SIGALRM, self.on_alarm)
        signal.signal(signal.SIGCHLD, reap_children)
        self.namespace = new_namespace({})
        self.preload(inputs)

    def serve(self) -> None:
        dumps, loads, getpid, exit_now = json.dumps, json.loads, os.getpid, os._exit
        recv, send, send_raw = recv_frame, send_frame, send_pieces
        while True:
            frame = recv(self.control)
            if frame is None:
                exit_now(0)
            request = loads(frame)
            op = request["op"]
            raw = None
            if op == "run_cell":
                reply = dumps(self.run_cell(request["code"], request["limit"])).encode()
            elif op == "preload":
                reply = self.preload(request["inputs"]).encode()
            else:
                doc, raw = self.read_result()
                reply = dumps(doc).encode()
            if getpid() != self.me:
                exit_now(0)  # a process the cell forked must not answer for the interpreter
            send(self.control, reply)
            if raw is not None:
                send_raw(self.control, [raw])

    def preload(self, inputs: str) -> str:
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
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the interpreter goes on
            status, tb = "error", cut_middle(format_error(e), self.traceback_cap)
        flush_stdio()
        # Between cells the supervisor kills whatever the cell left running; we reap those.
        signal.signal(signal.SIGCHLD, reap_children)
        reap_children()
        return {"status": status, "traceback": tb}

    def read_result(self) -> tuple[dict, bytearray | None]:
        """The reply to `read_result`: its document, and when it is a tensor, the tensor's raw bytes,
        which go in a frame of their own after it (the supervisor reads them knowing their size)."""
        value = self.namespace.get("result", self)
        if value is self:
            return {"status": "missing"}, None
        try:
            if type(value) not in self.tensor_types:
                return {"status": "invalid", "reason": f"result is a {type_name(type(value))[:80]}, not a torch.Tensor"}, None
            if value.is_meta:
                return {"status": "invalid", "reason": "result is a meta tensor"}, None
            head, raw = codec.to_bytes(value)
            return {"status": "ok", "result": head}, raw
        except codec.CodecError as e:
            return {"status": "invalid", "reason": f"result is invalid: {e}"}, None
        except BaseException as e:
            return {"status": "invalid", "reason": f"result could not be encoded: {type(e).__name__}"}, None


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
    """The traceback without the interpreter's own frames."""
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


def type_name(cls: type) -> str:
    """A library type by its dotted path (`torch.return_types.sort`, not `sort`); builtins and the
    interpreter's own classes by name."""
    module = cls.__module__
    if not isinstance(module, str) or module in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"
