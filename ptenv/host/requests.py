"""The host's half of the protocol: one function per request a supervisor serves, each sending it
over a transport's `call` (ptenv.host.transports) and parsing the reply strictly. The sandbox is
hostile: no reply is trusted to be well formed.

    preload     {"inputs": JSON text of {name: encoded tensor}}   a fresh session, the inputs preloaded
    run_cell    {"code": the cell's source}                       run one cell
    read_result {}                                                `result`, encoded
    end_session {}                                                every process of the model's killed
    trial       {"source", "name", "inputs" (as preload's), "cases": JSON text of [{param: {"tensor":
                 encoded} | {"value": v}}], "call_limit": seconds per call, "allowlist": JSON text of
                 {"allow": [aten op], "autograd": bool} or null}
    shell       {"command", "cwd"}                                a model's bash command (ptenv.host.local)

The same names are the supervisor's handlers and the interpreter's ops. Blame (blame.py) is
decided here, where it is known: a reply that does not follow the protocol, or a transport that
fails, is a HarnessFault; an answer that is not one is a ModelFault.
"""

import json
import keyword
from dataclasses import dataclass

import torch

from ptenv.host.blame import HarnessFault, ModelFault
from ptenv.inside import codec
from ptenv.inside.protocol import MAX_HIDDEN_OUTPUTS, Limits, model_text, one_line

STATUSES = ("ok", "error", "timeout", "reset")
CELL_KEYS = {"status", "stdout", "stderr", "stdout_cut", "stderr_cut", "reset", "limit"}
RESERVED_NAMES = ("torch", "result")
CALL_LIMIT = 5.0  # seconds one hidden call may run
# Seconds one trace may run at the efficiency level: make_fx takes about 1.4 ms of CPU an op call, so the
# largest graph a trial carries (about 1,500) takes some 2 s, and a loaded machine must not fail it.
TRACE_LIMIT = 20.0
CASE_STATUSES = ("error", "died", "timeout")  # a failed call's status in a trial's reply


@dataclass(frozen=True)
class CellReply:
    stdout: str
    stderr: str  # including the traceback when the cell raised
    status: str  # ok | error | timeout | reset
    note: str  # one line: stopped, variables reset, output cut; "" when there is nothing to say

    def text(self) -> str:
        """The tool's answer to the model."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("stderr:\n" + self.stderr.rstrip("\n"))
        if self.note:
            parts.append(f"[{self.note}]")
        return model_text("\n".join(parts)) if parts else "(no output)"


@dataclass(frozen=True)
class CaseResult:
    outputs: list | None  # decoded tensors, or None when the call failed
    status: str  # ok | error | died | timeout | invalid
    reason: str


async def send(call, sandbox_id: str, op: str, fields: dict, timeout: float, where: str) -> dict:
    """One request's reply document; a HarnessFault if the transport fails."""
    try:
        return await call(sandbox_id, op, fields, timeout)
    except Exception as e:
        raise HarnessFault(where, f"{type(e).__name__}: {one_line(e)}") from e


async def preload(call, sandbox_id: str, inputs: dict[str, torch.Tensor], *, timeout: float, limits: Limits) -> None:
    """Start a fresh session with these tensors under their names (a preload replaces the session)."""
    doc = await send(call, sandbox_id, "preload", preload_fields(inputs), timeout, "preloading the inputs")
    reply = parse_cell_reply(doc, limits, "preloading the inputs")
    if reply.status != "ok":
        raise HarnessFault("preloading the inputs", one_line(reply.stderr))


async def run_cell(call, sandbox_id: str, code: str, *, timeout: float, limits: Limits) -> str:
    """The tool's answer to the model: output, traceback and any notice (stopped, reset, cut), from
    a sandbox under `limits` (the transport's)."""
    doc = await send(call, sandbox_id, "run_cell", {"code": code}, timeout, "running a cell")
    return parse_cell_reply(doc, limits, "running a cell").text()


async def read_result(call, sandbox_id: str, *, timeout: float) -> torch.Tensor | None:
    """The model's `result` as a plain tensor, None if there is none; a ModelFault if it is invalid."""
    return parse_result_doc(await send(call, sandbox_id, "read_result", {}, timeout, "reading result back"))


def parse_result_doc(doc) -> torch.Tensor | None:
    """The reply to `read_result` as read_result returns it."""
    status = doc.get("status") if isinstance(doc, dict) else None
    if status == "missing" and set(doc) == {"status"}:
        return None
    if status == "invalid" and set(doc) == {"status", "reason"} and isinstance(doc["reason"], str):
        raise ModelFault("invalid_result", one_line(doc["reason"], 200))
    if status == "ok" and set(doc) == {"status", "result"}:
        try:
            return codec.decode(doc["result"])
        except codec.CodecError as e:
            raise ModelFault("invalid_result", f"result could not be decoded: {e}") from None
    # The supervisor rebuilds this document from the interpreter's reply: what gets past it is the model's.
    raise ModelFault("invalid_result", f"result reply is malformed: {one_line(doc, 80)!r}")


async def end_session(call, sandbox_id: str, *, timeout: float) -> None:
    """Kill every process of the model's in the sandbox: nothing of the rollout outlives it."""
    doc = await send(call, sandbox_id, "end_session", {}, timeout, "ending the session")
    if doc != {"status": "ok"}:
        raise HarnessFault("ending the session", f"the reply is malformed: {one_line(repr(doc), 120)}")


async def trial(call, sandbox_id: str, *, source: str, name: str, inputs: dict[str, torch.Tensor], cases: list[dict],
                allowlist: dict | None, limits: Limits, trace: bool = False) -> tuple[list[CaseResult], bool]:
    """Run the answer's function on the hidden cases' arguments in the sandbox (their expected
    outputs never leave the host): (one CaseResult per case, whether the callers ran with new
    processes refused). With `trace` (the efficiency level) the tensors go as dtypes and shapes only
    and each case's output is the function's graph, each trace with TRACE_LIMIT. The request's
    timeout is the trial's whole budget: one load of the answer, every call with its grace, and the
    reserve the supervisor keeps after its own deadline."""
    call_limit = TRACE_LIMIT if trace else CALL_LIMIT
    fields = trial_fields(source, name, inputs, cases, allowlist, call_limit, trace=trace)
    doc = await send(call, sandbox_id, "trial", fields, trial_timeout(limits, len(cases), call_limit), "the trial")
    return parse_trial_reply(doc, len(cases))


def trial_timeout(limits: Limits, cases: int, call_limit: float = CALL_LIMIT) -> float:
    """The host's wait for a trial: one load of the answer, every call with its grace, and the
    reserve the supervisor keeps past its own deadline (ptenv/inside/trial.py), with a grace to spare."""
    return limits.cell_timeout + cases * (call_limit + limits.grace) + 3 * limits.grace


def preload_fields(inputs: dict[str, torch.Tensor]) -> dict:
    encoded = {}
    for name, tensor in inputs.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"input name {name!r} is not a Python identifier")
        if name in RESERVED_NAMES or name.startswith("__"):
            raise ValueError(f"input name {name!r} is reserved in the cell namespace")
        encoded[name] = codec.encode(tensor)
    return {"inputs": json.dumps(encoded)}


def trial_fields(source: str, name: str, inputs: dict[str, torch.Tensor], cases: list[dict], allowlist: dict | None,
                 call_limit: float = CALL_LIMIT, *, trace: bool = False) -> dict:
    encoded = [{k: tensor_field(v, trace) if isinstance(v, torch.Tensor) else {"value": v} for k, v in args.items()}
               for args in cases]
    return {"source": source, "name": name, "inputs": preload_fields(inputs)["inputs"], "cases": json.dumps(encoded),
            "call_limit": call_limit, "allowlist": json.dumps(allowlist), "trace": trace}


def tensor_field(tensor: torch.Tensor, trace: bool) -> dict:
    """A case's tensor as the trial takes it: encoded, or for a trace its dtype and shape alone."""
    if trace:
        return {"spec": {"dtype": codec.DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape)}}
    return {"tensor": codec.encode(tensor)}


def parse_cell_reply(doc, limits: Limits, where: str = "running a cell") -> CellReply:
    """The reply to `run_cell` (or `preload`) of a sandbox under `limits`; a HarnessFault if it is not one."""
    if not isinstance(doc, dict) or set(doc) != CELL_KEYS:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise HarnessFault(where, f"cell reply must have keys {sorted(CELL_KEYS)}, got {keys}")
    ok = (
        doc["status"] in STATUSES
        and isinstance(doc["stdout"], str)
        and isinstance(doc["stderr"], str)
        and all(type(doc[k]) is int and doc[k] >= 0 for k in ("stdout_cut", "stderr_cut"))
        and (doc["reset"] is None or isinstance(doc["reset"], str))
        and type(doc["limit"]) in (int, float)
    )
    if not ok:
        raise HarnessFault(where, f"cell reply has a field of the wrong type or value: status={doc['status']!r}")
    note = cell_note(doc, limits.output_bytes)
    return CellReply(stdout=doc["stdout"], stderr=doc["stderr"], status=doc["status"], note=note)


def cell_note(doc: dict, kept: int) -> str:
    notes = []
    limit, reset = doc["limit"], doc["reset"]
    fresh = "all variables were reset (inputs are preloaded again)"
    if doc["status"] == "timeout":
        stopped = f"The cell was stopped after the {limit:g} s time limit"
        notes.append(f"{stopped} and the session was restarted: {fresh}." if reset else f"{stopped}; variables are kept.")
    elif reset:
        notes.append(f"The session {one_line(reset, 100)} and was restarted: {fresh}.")
    for stream in ("stdout", "stderr"):
        if doc[f"{stream}_cut"]:
            notes.append(f"{doc[stream + '_cut']:,} more bytes of {stream} were cut (the first {kept:,} are shown).")
    return " ".join(notes)


def parse_trial_reply(doc, n: int) -> tuple[list[CaseResult], bool]:
    """(one CaseResult per case, whether the caller ran with new processes refused); a HarnessFault
    if the reply does not follow the protocol. The outputs are the model's: one that does not decode
    is that case's failure."""
    if not isinstance(doc, dict) or set(doc) != {"load", "protected", "cases"} or type(doc["protected"]) is not bool \
            or not isinstance(doc["cases"], list):
        raise HarnessFault("the trial", f"its reply is malformed: {one_line(repr(doc), 120)}")
    if isinstance(doc["load"], str):
        reason = f"the answer could not be loaded: {model_text(one_line(doc['load'], 300))}"
        return [CaseResult(None, "error", reason)] * n, doc["protected"]
    if doc["load"] is not None or len(doc["cases"]) != n:
        raise HarnessFault("the trial", f"its reply has {len(doc['cases'])} cases for {n}")
    return [parse_case(case) for case in doc["cases"]], doc["protected"]


def parse_case(case) -> CaseResult:
    if not isinstance(case, dict):
        raise HarnessFault("the trial", "a hidden case's report is not an object")
    status = case.get("status")
    if status in CASE_STATUSES and set(case) == {"status", "reason"} and isinstance(case["reason"], str):
        return CaseResult(None, status, model_text(one_line(case["reason"], 300)))
    if status != "ok" or set(case) != {"status", "outputs"} or not isinstance(case["outputs"], list) \
            or not 1 <= len(case["outputs"]) <= MAX_HIDDEN_OUTPUTS:
        raise HarnessFault("the trial", f"a hidden case's report is malformed: {one_line(repr(case), 120)}")
    try:
        return CaseResult([codec.decode(t) for t in case["outputs"]], "ok", "")
    except codec.CodecError as e:  # the function's own output
        return CaseResult(None, "invalid", f"an output could not be decoded: {e}")


def load_reply(stdout: str, cap: int, what: str):
    """The one JSON document a reply printed by `ptenv-request` holds (Prime); ValueError saying why not."""
    if len(stdout) > cap:
        raise ValueError(f"{what} reply of {len(stdout)} characters is over the {cap} cap")
    try:
        return json.loads(stdout)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise ValueError(f"{what} reply is not JSON: {stdout[:80]!r}") from None
