"""The caller: the process of a function task's trial. The supervisor forks it (torch already
imported, not the model's live session), as the model, after the rollout's last turn; it runs the
answer's source once, then calls the function on each hidden case the supervisor sends, and sends
back each call's outputs, encoded.

It is the model's. The answer runs in this process and may patch anything here, so the supervisor
reads every reply as the model's answer (bounded, checked, its time limit enforced from outside by
a kill), and the host decodes and grades the outputs itself. Before the answer runs, a seccomp
filter refuses new processes and programs: the one process the supervisor started is the only one
that can answer. At a family's hardest level the allowlist (allowlist.py) is installed first.
"""

import ctypes
import errno
import json
import os
import traceback

import torch

from ptenv.inside import allowlist
from ptenv.inside import codec, graph, seccomp
from ptenv.inside.protocol import MAX_HIDDEN_OUTPUTS, one_line, recv_frame, send_frame
from ptenv.inside.namespace import new_namespace
from ptenv.inside.syscalls import PR_SET_NO_NEW_PRIVS, libc


def refuse_new_processes(rules: dict) -> bool:
    """Deny fork, vfork, clone without CLONE_THREAD, and exec (and under an allowlist, what
    ALLOWLIST_RULES deny), to this process from now on; False where seccomp cannot be had (the supervisor then
    says the phase ran with less protection)."""
    try:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        seccomp.install(rules)
        return True
    except (OSError, AttributeError, ctypes.ArgumentError):
        return False


def prepare(allowed: dict | None, trace: bool) -> bool:
    """Before the answer is here: the tracer warmed up if it will trace (graph.warm_up: fast where
    the process it forked from did it), the allowlist, if any ({"allow", "autograd"}), then the
    filters, then its native stubs (the filters' installation is the harness's last foreign call).
    Whether the OS refuses all it should."""
    if trace:
        graph.warm_up()
    if allowed is None:
        return refuse_new_processes(seccomp.CALLER_RULES)
    with open("/proc/self/mem", "r+b", buffering=0) as memory:
        allowlist.install(set(allowed["allow"]))
        allowlist.remove_libraries()
        protected = refuse_new_processes({**seccomp.CALLER_RULES, **seccomp.ALLOWLIST_RULES})
        allowlist.seal(memory, allowed["autograd"])
    return protected


def serve(control, inputs: str, allowlist: dict | None, trace: bool) -> None:
    """Prepare (the allowlist if any, then the filters) and say so; only then take the answer's
    source from the supervisor, load it and say whether it defines the function; then answer one
    call per request until the channel closes (with `trace`, the efficiency level: each case's
    tensors come as specs, and the reply is the function's graph, graph.trace_case). So the status
    is read before any code of the answer is in this process, and every frame after it is the
    answer's to write. Every reference used after the answer runs is taken before it does."""
    dumps, loads, getpid, me = json.dumps, json.loads, os.getpid, os.getpid()
    recv, send, decode, to_bytes, Tensor = recv_frame, send_frame, codec.decode, codec.to_bytes, torch.Tensor
    trace_case, frombuffer, uint8 = graph.trace_case, torch.frombuffer, torch.uint8
    tuple_, type_ = tuple, type
    try:
        protected = prepare(allowlist, trace)
    except Exception as e:  # before the answer is here: the harness's failure
        send(control, dumps({"status": "unprepared", "reason": describe(e)}).encode())
        return
    send(control, dumps({"status": "prepared", "protected": protected}).encode())
    frame = recv(control)
    if frame is None:
        return
    answer = loads(frame)
    try:
        examples = {k: decode(v) for k, v in loads(inputs).items()}
        namespace = new_namespace(examples)
        exec(compile(answer["source"], "<answer>", "exec"), namespace)
        function = namespace.get(answer["name"])
        if not callable(function):
            raise NameError(f"the answer does not define a function `{answer['name']}`")
        send(control, dumps({"status": "ready"}).encode())
    except BaseException as e:
        send(control, dumps({"status": "error", "reason": describe(e, allowlist is not None)}).encode())
        return
    while True:
        frame = recv(control)
        if frame is None or getpid() != me:
            return
        try:
            if trace:
                value = frombuffer(bytearray(trace_case(function, loads(frame))), dtype=uint8)
            else:
                args = {k: decode(v["tensor"]) if "tensor" in v else v["value"] for k, v in loads(frame).items()}
                value = function(**args)
            outputs = list(value) if type_(value) is tuple_ else [value]
            if len(outputs) > MAX_HIDDEN_OUTPUTS:
                raise ValueError(f"returned {len(outputs)} values; at most {MAX_HIDDEN_OUTPUTS} are read")
            for i, output in enumerate(outputs):
                if type_(output) is not Tensor:
                    raise TypeError(f"returned a {type_(output).__name__}, not a torch.Tensor"
                                    + (f" (item {i})" if len(outputs) > 1 else ""))
                if output.is_meta:
                    raise TypeError("returned a meta tensor")
            replies = [dumps({"status": "ok", "count": len(outputs)}).encode()]
            for head, raw in map(to_bytes, outputs):  # each as `result` replies: skeleton, then bytes
                replies += [dumps({"status": "ok", "result": head}).encode(), raw]
        except BaseException as e:
            replies = [dumps({"status": "error", "reason": describe(e, allowlist is not None)}).encode()]
        if getpid() != me:
            return  # a process the answer made (where seccomp could not stop it) never answers
        for reply in replies:
            send(control, reply)


# What the filters refuse, named in the reason of an answer that tried it (seccomp answers EPERM;
# the loader reports a refused executable mapping in its own words).
REFUSED = {False: "refused in the trial: no new process or program",
           True: "not on the allowlist of the trial: no new process, program, native library or file "
                 "opened for writing"}
LOADER_REFUSALS = ("failed to map segment", "Could not load this library")


def describe(e: BaseException, banned: bool = False) -> str:
    """One line: the exception and the answer's line that raised it, after what the filter refused
    if that is what it was."""
    try:
        where = ""
        for frame in traceback.extract_tb(e.__traceback__):
            if frame.filename == "<answer>":
                where = f" (answer line {frame.lineno})"
        text = f"{type(e).__name__}: {e}{where}"
        return one_line(f"{REFUSED[banned]}: {text}" if refused(e) else text, 300)
    except BaseException:
        return "an exception whose message could not be formatted"


def refused(e: BaseException) -> bool:
    for _ in range(8):  # the exception and what it was raised from
        if isinstance(e, OSError) and e.errno == errno.EPERM:  # seccomp
            return True
        if isinstance(e, (OSError, ImportError)) and any(m in str(e) for m in LOADER_REFUSALS):
            return True
        e = e.__cause__ or e.__context__
        if e is None:
            return False
    return False
