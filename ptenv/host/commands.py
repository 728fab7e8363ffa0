"""Host side of the harness's requests to a sandbox's supervisor (Transport.call), and strict
parsers of the documents they answer with:

    preload {"inputs": JSON text of {name: encoded tensor}}   fresh namespace, inputs loaded
    exec    {"code": the cell's source}                       run one cell
    result  {}                                                encode `result`
    hidden  a function task's hidden phase (ptenv.host.hidden)

The sandbox is hostile: every reply is checked here and never trusted to be well formed.
"""

import json
import keyword
from dataclasses import dataclass

import torch

from ptenv.inside import codec
from ptenv.inside.protocol import Limits, model_text, one_line

STATUSES = ("ok", "error", "timeout", "reset")
CELL_KEYS = {"status", "stdout", "stderr", "stdout_cut", "stderr_cut", "reset", "limit"}
RESERVED_NAMES = ("torch", "result")


class ProtocolError(RuntimeError):
    """The sandbox did not answer a request as the protocol says (a harness failure)."""


class ReplyError(ValueError):
    """A sandbox reply that does not follow the protocol."""


class ResultError(ValueError):
    """`result` is missing the mark: not a plain tensor, or the reply carrying it is unusable."""


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


def preload_fields(inputs: dict[str, torch.Tensor]) -> dict:
    """Start a fresh namespace with these tensors under their names (a preload replaces the namespace)."""
    encoded = {}
    for name, tensor in inputs.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"input name {name!r} is not a Python identifier")
        if name in RESERVED_NAMES or name.startswith("__"):
            raise ValueError(f"input name {name!r} is reserved in the cell namespace")
        encoded[name] = codec.encode(tensor)
    return {"inputs": json.dumps(encoded)}


def exec_fields(code: str) -> dict:
    return {"code": code}


def parse_exec_reply(doc: dict, limits: Limits) -> CellReply:
    """The reply to `exec` (or `preload`) of a sandbox under `limits` as a CellReply; ReplyError if
    it is not one."""
    if not isinstance(doc, dict) or set(doc) != CELL_KEYS:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ReplyError(f"cell reply must have keys {sorted(CELL_KEYS)}, got {keys}")
    ok = (
        doc["status"] in STATUSES
        and isinstance(doc["stdout"], str)
        and isinstance(doc["stderr"], str)
        and all(type(doc[k]) is int and doc[k] >= 0 for k in ("stdout_cut", "stderr_cut"))
        and (doc["reset"] is None or isinstance(doc["reset"], str))
        and type(doc["limit"]) in (int, float)
    )
    if not ok:
        raise ReplyError(f"cell reply has a field of the wrong type or value: status={doc['status']!r}")
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


def parse_result_reply(doc: dict) -> torch.Tensor | None:
    """The model's `result` as a plain tensor, None if there is none; ResultError if it is invalid."""
    status = doc.get("status") if isinstance(doc, dict) else None
    if status == "missing" and set(doc) == {"status"}:
        return None
    if status == "invalid" and set(doc) == {"status", "reason"} and isinstance(doc["reason"], str):
        raise ResultError(one_line(doc["reason"], 200))
    if status == "ok" and set(doc) == {"status", "result"}:
        try:
            return codec.decode(doc["result"])
        except codec.CodecError as e:
            raise ResultError(f"result could not be decoded: {e}") from None
    raise ResultError(f"result reply is malformed: {one_line(doc, 80)!r}")


def load_reply(stdout: str, cap: int, what: str, error: type[ValueError]):
    """The one JSON document a reply holds, or `error` saying why it does not."""
    if len(stdout) > cap:
        raise error(f"{what} reply of {len(stdout)} characters is over the {cap} cap")
    try:
        return json.loads(stdout)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise error(f"{what} reply is not JSON: {stdout[:80]!r}") from None
