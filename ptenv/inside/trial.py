"""A function task's trial, the supervisor's side: after the rollout's last turn the model's session
is ended, and the answer's function is called on each hidden case in a caller (caller.py), a process
forked from the supervisor as the model. Every call's time limit is enforced from here, by a kill.

Everything a caller sends is the model's answer: a reply that is late, malformed or missing fails
that case, and a fresh caller takes the next one.
"""

import os
import select
import signal
import socket
import time

from ptenv.inside import allowlist, caller
from ptenv.inside.processes import ModelProcess
from ptenv.inside.protocol import HIDDEN_OUTPUT_CAP, MAX_HIDDEN_OUTPUTS, model_text, one_line, recv_base64, recv_frame
from ptenv.inside.replies import SKELETON_CAP, bounded_loads, invalid, result_doc


def run(supervisor, source: str, name: str, cases: list, call_limit: float, ban: dict | None, limit: float) -> dict:
    """Run the answer's function on each hidden case in a caller, under the allowlist if any
    ({"allow", "autograd"}, allowlist.py), each call within `call_limit`: {"load": why the answer could not be
    loaded or None, "protected": whether the caller could not start processes, "cases": one report
    per case}. A caller that times out, dies or answers out of protocol is killed, that case is
    the model's failure, and a fresh caller takes the next case."""
    # Nothing the model left running may watch or touch the callers: the session is over.
    supervisor.session.end()
    reports, process, load, protected = [], None, None, True
    for case in cases:
        if reports and reports[-1]["status"] == "timeout":
            # One time-out ends the trial: a hung answer costs one call's limit, not N of them.
            reports.append({"status": "timeout", "reason": "not run: an earlier case ran past its limit"})
            continue
        if process is None:
            process, load, protected = start_caller(supervisor, source, name, ban, limit)
            if load is not None:
                break
        report = call(supervisor, process, case, call_limit, ban is not None)
        reports.append(report)
        if report["status"] in ("timeout", "died"):
            stop_caller(supervisor, process)
            process = None
    if process is not None:
        stop_caller(supervisor, process)
    supervisor.session.start()  # a fresh session, so the sandbox still answers as before
    return {"load": load, "protected": protected, "cases": reports}


def start_caller(supervisor, source: str, name: str, ban: dict | None,
                 limit: float) -> tuple[ModelProcess | None, str | None, bool]:
    """Fork a caller from the supervisor (torch imported, not the model's session); wait for it to
    load the answer: (caller, why it could not or None, whether it could not start processes)."""
    control, child_end = socket.socketpair()

    def serve() -> None:
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.setpgid(0, 0)
        caller.serve(child_end, supervisor.session.inputs, source, name, ban)

    pid = supervisor.fork_model_process(control, {child_end.fileno()}, 0, serve)
    child_end.close()
    process = ModelProcess(pid, control, os.pidfd_open(pid))
    supervisor.callers[pid] = process
    frame, failure = supervisor.ask(process, None, limit, SKELETON_CAP, None)
    ready = bounded_loads(frame) if frame is not None else None
    if isinstance(ready, dict) and ready.get("status") == "ready":
        return process, None, ready.get("protected") is True
    if isinstance(ready, dict) and ready.get("status") == "ban_failed":  # before the answer ran
        stop_caller(supervisor, process)
        raise RuntimeError(f"the ban could not be installed: {ready.get('reason')}")
    if isinstance(ready, dict) and ready.get("status") == "error" and isinstance(ready.get("reason"), str):
        why = ready["reason"]
    else:
        why = f"the process loading it {failure or 'ran past the time limit'}" if frame is None \
            else "the process loading it sent a malformed reply"
    stop_caller(supervisor, process)
    return None, model_text(one_line(why, 300)), True  # no case ran: nothing was less protected


def call(supervisor, process: ModelProcess, case: dict, call_limit: float, banned: bool) -> dict:
    """One hidden call's report: ok with the outputs, or error, invalid, timeout or died with a reason."""
    frame, failure = supervisor.ask(process, case, call_limit, SKELETON_CAP, None)
    if frame is None:
        if failure is None:
            return {"status": "timeout", "reason": f"ran past the {call_limit:g} s limit"}
        code = os.waitstatus_to_exitcode(process.status) if banned and process.status is not None else 0
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
    outputs, deadline = [], time.monotonic() + call_limit + supervisor.limits.grace
    for _ in range(count):
        try:
            output = read_output(process, deadline)
        except TimeoutError:
            return {"status": "timeout", "reason": f"ran past the {call_limit:g} s limit"}
        except (ValueError, OSError):
            return {"status": "died", "reason": "the function's process sent a malformed reply"}
        if output.get("status") == "invalid":
            return {"status": "died", "reason": output["reason"]}
        outputs.append(output)
    return {"status": "ok", "outputs": outputs}


def read_output(process: ModelProcess, deadline: float) -> dict:
    """One output of a call, sent as the interpreter sends `result` (skeleton, then bytes), as an
    encoded tensor; an invalid document if it is not one or is over the cap."""
    frame = recv_frame(process.control, SKELETON_CAP, deadline)
    doc, nbytes = result_doc(frame) if frame is not None else (invalid("the reply ended early"), 0)
    if doc["status"] != "ok":
        return invalid(doc.get("reason", "an output is missing"))
    if (nbytes + 2) // 3 * 4 > HIDDEN_OUTPUT_CAP:
        return invalid(f"an output is over the {HIDDEN_OUTPUT_CAP}-byte cap")
    data = recv_base64(process.control, nbytes, deadline)
    if data is None:
        return invalid("the reply ended early")
    return {**doc["result"], "data": data.decode("ascii")}


def stop_caller(supervisor, process: ModelProcess) -> None:
    """Kill a caller (and, where seccomp could not stop it, what it started: its process group)."""
    for kill in (lambda: signal.pidfd_send_signal(process.pidfd, signal.SIGKILL),
                 lambda: os.killpg(process.pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    select.select([process.pidfd], [], [], supervisor.limits.grace)  # bounded: a D-state caller is reaped later
    supervisor.reap()
    process.close()
    supervisor.callers.pop(process.pid, None)
