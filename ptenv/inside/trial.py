"""A function task's trial, the supervisor's side: the answer's function called on each hidden case
in a caller (caller.py), a process forked from the supervisor as the model, with the model's
session ended first.

Two rules make it total, whatever the answer does:
- One deadline. The trial ends by its deadline, derived from the host's own wait for the request
  (its timeout less RESERVE, kept to stop a caller and reply): every wait in it (a caller getting
  ready, loading the answer, a call's reply and its outputs) ends by then. Loading the answer has
  one budget for all its callers together (the cell time limit), and a call's reply and outputs
  share one deadline. A case the time does not reach is the model's failure, never ours.
- One trust rule. A caller reports that it is prepared (the allowlist installed, new processes
  refused) before the answer's source is sent to it; every frame after that is the answer's to
  write, and can only fail a case.
"""

import json
import os
import signal
import socket
import time
from dataclasses import dataclass

from ptenv.inside import allowlist, caller
from ptenv.inside.processes import ModelProcess
from ptenv.inside.protocol import (HIDDEN_OUTPUT_CAP, MAX_HIDDEN_OUTPUTS, model_text, one_line, readable, recv_base64,
                                   recv_frame)
from ptenv.inside.replies import SKELETON_CAP, bounded_loads, exit_code, invalid, result_doc

NOT_RUN = {"status": "timeout", "reason": "not run: an earlier case ran past its limit"}
OUT_OF_TIME = {"status": "timeout", "reason": "not run: the trial ran out of time"}


def reserve(grace: float) -> float:
    """Seconds between a trial's deadline and the host's: a caller's stop (at most `grace`) and the reply."""
    return 2 * grace


@dataclass
class Trial:
    source: str
    name: str
    inputs: str  # the example inputs as JSON text, preloaded in each caller's namespace
    cases: list
    call_limit: float
    allowlist: dict | None  # {"allow": [op], "autograd": bool}, or None: everything allowed
    trace: bool  # the efficiency level: each case traced into a graph (graph.py), not called
    deadline: float  # time.monotonic(): the trial's reply goes out by then
    loads_left: float  # seconds all callers together may spend loading the answer
    grace: float

    def left(self) -> float:
        """How long a wait that may overrun by `grace` can last now."""
        return max(0.0, self.deadline - self.grace - time.monotonic())


class OutOfTime(Exception):
    """The trial's deadline came before a caller was ready: the model's previous cases and loads used the time."""


def run(supervisor, trial: Trial) -> list:
    """The trial's reply as pieces of one frame: {"load": why the answer could not be loaded or
    None, "protected": whether its callers could not start processes, "cases": one report per
    case}. A caller that times out, dies or answers out of protocol is killed, that case is the
    model's failure, and a fresh caller takes the next case; one time-out ends the trial, as the
    deadline does."""
    supervisor.session.end()  # nothing the model left running may watch or touch the callers
    reports, process, load, protected = [], None, None, True
    for case in trial.cases:
        if reports and reports[-1]["status"] == "timeout":  # one time-out ends the trial
            reports.append(OUT_OF_TIME if reports[-1] is OUT_OF_TIME else NOT_RUN)
            continue
        if process is None:
            try:
                process, load, prepared_protected = start_caller(supervisor, trial)
            except OutOfTime:
                reports.append(OUT_OF_TIME)
                continue
            protected = protected and prepared_protected
            if load is not None:
                if not reports:
                    break  # the answer could not be loaded at all
                # Loaded once, not again: the budget for loading it is spent, or its loading fails now.
                again = {"status": "error", "reason": f"the answer could not be loaded again: {load}"}
                reports += [again] * (len(trial.cases) - len(reports))
                load = None
                break
        report = call(supervisor, process, trial, case)
        reports.append(report)
        if report["status"] in ("timeout", "died"):
            stop_caller(supervisor, process)
            process = None
    if process is not None:
        stop_caller(supervisor, process)
    return reply_pieces(load, protected, reports)


def start_caller(supervisor, trial: Trial) -> tuple[ModelProcess | None, str | None, bool]:
    """Fork a caller from the supervisor (torch imported, not the model's session), wait until it
    is prepared, then send it the answer and wait for it to load it: (caller, why it could not be
    loaded or None, whether it could not start processes). A caller that is not prepared is our
    failure (RuntimeError): no code of the answer was in it."""
    control, child_end = socket.socketpair()

    def serve() -> None:
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.setpgid(0, 0)
        caller.serve(child_end, trial.inputs, trial.allowlist, trial.trace)

    pid = supervisor.fork_model_process(control, {child_end.fileno()}, 0, serve)
    child_end.close()
    process = ModelProcess(pid, control, os.pidfd_open(pid))
    supervisor.callers[pid] = process
    limit = min(supervisor.limits.cell_timeout, trial.left())
    frame, failure = supervisor.ask(process, None, limit, SKELETON_CAP, None)
    status = caller_status(frame)
    if status is None or status[0] != "prepared":
        stop_caller(supervisor, process)
        if frame is None and failure is None and limit < supervisor.limits.cell_timeout:
            raise OutOfTime
        why = status[1] if status else failure or "ran past the time limit"
        raise RuntimeError(f"the trial's caller could not be prepared: {why}")
    start = time.monotonic()
    frame, failure = supervisor.ask(process, {"source": trial.source, "name": trial.name},
                                    min(trial.loads_left, trial.left()), SKELETON_CAP, None)
    trial.loads_left -= time.monotonic() - start
    ready = bounded_loads(frame) if frame is not None else None
    if isinstance(ready, dict) and ready.get("status") == "ready":
        return process, None, status[1]
    if isinstance(ready, dict) and ready.get("status") == "error" and isinstance(ready.get("reason"), str):
        why = ready["reason"]
    else:
        why = f"the process loading it {failure or 'ran past the time limit'}" if frame is None \
            else "the process loading it sent a malformed reply"
    stop_caller(supervisor, process)
    return None, model_text(one_line(why, 300)), status[1]


def caller_status(frame) -> tuple[str, bool | str] | None:
    """("prepared", protected) or ("unprepared", why) from a caller's first frame, which the caller's
    own code sends before the answer is in it; None if it is neither."""
    doc = bounded_loads(frame) if frame is not None else None
    if isinstance(doc, dict) and doc.get("status") == "prepared" and type(doc.get("protected")) is bool:
        return "prepared", doc["protected"]
    if isinstance(doc, dict) and doc.get("status") == "unprepared" and isinstance(doc.get("reason"), str):
        return "unprepared", model_text(one_line(doc["reason"], 300))
    return None


def call(supervisor, process: ModelProcess, trial: Trial, case: dict) -> dict:
    """One hidden call's report: ok with the outputs, or error, timeout or died with a reason. The
    call's reply and its outputs share one deadline."""
    limit = min(trial.call_limit, trial.left())
    late = f"ran past the {trial.call_limit:g} s limit" if limit == trial.call_limit else "the trial ran out of time"
    deadline = time.monotonic() + limit + trial.grace
    frame, failure = supervisor.ask(process, case, limit, SKELETON_CAP, None)
    if frame is None:
        if failure is None:
            return {"status": "timeout", "reason": late}
        return {"status": "died", "reason": death_reason(process, failure, trial.allowlist is not None)}
    head = bounded_loads(frame)
    status = head.get("status") if isinstance(head, dict) else None
    if status == "error" and isinstance(head.get("reason"), str):
        return {"status": "error", "reason": model_text(one_line(head["reason"], 300))}
    count = head.get("count") if status == "ok" else None
    if type(count) is not int or not 1 <= count <= MAX_HIDDEN_OUTPUTS:
        return {"status": "died", "reason": "the function's process sent a malformed reply"}
    outputs = []
    for _ in range(count):
        try:
            output = read_output(process, deadline)
        except TimeoutError:
            return {"status": "timeout", "reason": late}
        except (ValueError, OSError):
            return {"status": "died", "reason": "the function's process sent a malformed reply"}
        if output.get("status") == "invalid":
            return {"status": "died", "reason": output["reason"]}
        outputs.append(output)
    return {"status": "ok", "outputs": outputs}


def death_reason(process: ModelProcess, failure: str, allowlisted: bool) -> str:
    """Why a caller died mid-call: the allowlist's rule where an exit code or SIGSEGV names it."""
    code = exit_code(process.status) if allowlisted and process.status is not None else None
    if code in allowlist.TRAPS or code == -signal.SIGSEGV:
        return f"not on the allowlist: the function {allowlist.TRAPS.get(code, allowlist.OTHER_CODE)}"
    return model_text(one_line(failure, 200))


def read_output(process: ModelProcess, deadline: float) -> dict:
    """One output of a call, sent as the interpreter sends `result` (skeleton, then bytes): its
    dtype, shape and base64 bytes (kept as they came, not copied); an invalid document if it is not
    one or is over the cap."""
    frame = recv_frame(process.control, SKELETON_CAP, deadline)
    doc, nbytes = result_doc(frame) if frame is not None else (invalid("the reply ended early"), 0)
    if doc["status"] != "ok":
        return invalid(doc.get("reason", "an output is missing"))
    if (nbytes + 2) // 3 * 4 > HIDDEN_OUTPUT_CAP:
        return invalid(f"an output is over the {HIDDEN_OUTPUT_CAP}-byte cap")
    data = recv_base64(process.control, nbytes, deadline)
    if data is None:
        return invalid("the reply ended early")
    return {"dtype": doc["result"]["dtype"], "shape": doc["result"]["shape"], "data": data}


def reply_pieces(load: str | None, protected: bool, reports: list[dict]) -> list:
    """The reply as pieces of JSON text, the outputs' base64 among them as received: the reply
    costs the supervisor its outputs once, never a copy of them (bench/bench_replies.py)."""
    pieces = [f'{{"reply": {{"load": {json.dumps(load)}, "protected": {json.dumps(protected)}, "cases": ['.encode()]
    for i, report in enumerate(reports):
        pieces.append(b", " if i else b"")
        if report["status"] != "ok":
            pieces.append(json.dumps(report).encode())
            continue
        pieces.append(b'{"status": "ok", "outputs": [')
        for k, output in enumerate(report["outputs"]):
            head = f'{", " if k else ""}{{"dtype": {json.dumps(output["dtype"])}, "shape": {json.dumps(output["shape"])}, "data": "'
            pieces += [head.encode(), output["data"], b'"}']
        pieces.append(b"]}")
    pieces.append(b"]}}")
    return pieces


def stop_caller(supervisor, process: ModelProcess) -> None:
    """Kill a caller (and, where seccomp could not stop it, what it started: its process group)."""
    for kill in (lambda: signal.pidfd_send_signal(process.pidfd, signal.SIGKILL),
                 lambda: os.killpg(process.pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    readable([process.pidfd], supervisor.limits.grace)  # bounded: a D-state caller is reaped later
    supervisor.reap()
    process.close()
    supervisor.callers.pop(process.pid, None)
