"""What the supervisor makes of the model's processes' replies and ends. Whatever the interpreter
or a caller sends (malformed, oversized, nested) is rebuilt here into a well-formed, bounded
document of the supervisor's own, which is the model's answer."""

import json
import os
import signal

from ptenv.inside import codec
from ptenv.inside.protocol import cut_middle, model_text, one_line
from ptenv.inside.streams import Capture

INTERPRETER_BROKEN = 70  # the interpreter's exit code when a cell damaged the code that runs cells
SKELETON_CAP = 64 * 1024  # a result reply without its tensor bytes: dtype, shape, status, reason
MAX_CONTAINERS = 256  # JSON arrays and objects in that skeleton: a tensor's shape has at most 64


def describe(status: int) -> str:
    """How a model's process ended, from any wait status."""
    code = exit_code(status)
    if code is None:
        return f"changed state (wait status {status})"
    if code == INTERPRETER_BROKEN:
        return "broke (a cell damaged the code that runs cells)"
    if code >= 0:
        return f"exited with code {code}"
    name = signal_name(-code)
    return f"was killed by {name}" + (" (the CPU time limit)" if name == "SIGXCPU" else "")


def exit_code(status: int) -> int | None:
    """The exit code, or minus the signal that killed the process; None for a status that says neither."""
    if not -(1 << 31) <= status < 1 << 31:
        return None
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return None


def signal_name(number: int) -> str:
    """SIGKILL, or SIGRTMIN+6 for a real-time signal, which signal.Signals has no member for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"


def bounded_loads(data):
    """JSON from the model's process, parsed only when its nesting cannot cost memory out of
    proportion to its size (a reply of `[[[[]]]],...` would); None when it is not such JSON."""
    if data.count(b"[") + data.count(b"{") > MAX_CONTAINERS:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError):
        return None


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
    """The interpreter's reply to `read_result`, rebuilt from its parts: well formed and bounded
    whatever the model sent; and, when it is a tensor, the byte count of the frame of raw bytes
    that follows. The count is None for a reply the interpreter's code never sends: more of it may
    follow."""
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
