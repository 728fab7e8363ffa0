"""Host side of a function task's hidden phase: the `hidden` request (the answer's source and the
hidden cases' arguments; never their expected outputs), a strict parser of its reply, and the
verdict over the cases.

    hidden {"source", "name", "cases": JSON text of [{param: {"tensor": encoded} | {"value": v}}],
            "call_limit": seconds per call, "ban": JSON text of {"ops": [aten op], "autograd": bool} or null}

The reply's outputs are the model's: one that does not decode is that case's failure. A reply that
does not follow the protocol is the supervisor's, a harness error.
"""

import json
from dataclasses import dataclass

import torch

from ptenv.grader import Verdict, grade_outputs
from ptenv.host.commands import ReplyError
from ptenv.inside import codec
from ptenv.inside.protocol import MAX_HIDDEN_OUTPUTS, model_text, one_line

CALL_LIMIT = 5.0  # seconds one hidden call may run
FAILURES = {"error": "error", "died": "error", "timeout": "timeout"}  # a case's status -> the verdict's kind


@dataclass(frozen=True)
class CaseResult:
    outputs: list | None  # decoded tensors, or None when the call failed
    status: str  # ok | error | died | timeout | invalid
    reason: str


def fields(source: str, name: str, cases: list[dict], ban: dict | None, call_limit: float = CALL_LIMIT) -> dict:
    encoded = [{k: {"tensor": codec.encode(v)} if isinstance(v, torch.Tensor) else {"value": v} for k, v in args.items()}
               for args in cases]
    return {"source": source, "name": name, "cases": json.dumps(encoded), "call_limit": call_limit,
            "ban": json.dumps(ban)}


def parse_reply(doc, n: int) -> tuple[list[CaseResult], bool]:
    """(one CaseResult per case, whether the judge ran with new processes refused); ReplyError if the
    reply does not follow the protocol."""
    if not isinstance(doc, dict) or set(doc) != {"load", "protected", "cases"} or type(doc["protected"]) is not bool \
            or not isinstance(doc["cases"], list):
        raise ReplyError(f"hidden-phase reply is malformed: {one_line(repr(doc), 120)}")
    if isinstance(doc["load"], str):
        reason = f"the answer could not be loaded: {model_text(one_line(doc['load'], 300))}"
        return [CaseResult(None, "error", reason)] * n, doc["protected"]
    if doc["load"] is not None or len(doc["cases"]) != n:
        raise ReplyError(f"hidden-phase reply has {len(doc['cases'])} cases for {n}")
    return [parse_case(case) for case in doc["cases"]], doc["protected"]


def parse_case(case) -> CaseResult:
    if not isinstance(case, dict):
        raise ReplyError("a hidden case's report is not an object")
    status = case.get("status")
    if status in FAILURES and set(case) == {"status", "reason"} and isinstance(case["reason"], str):
        return CaseResult(None, status, model_text(one_line(case["reason"], 300)))
    if status != "ok" or set(case) != {"status", "outputs"} or not isinstance(case["outputs"], list) \
            or not 1 <= len(case["outputs"]) <= MAX_HIDDEN_OUTPUTS:
        raise ReplyError(f"a hidden case's report is malformed: {one_line(repr(case), 120)}")
    try:
        return CaseResult([codec.decode(t) for t in case["outputs"]], "ok", "")
    except codec.CodecError as e:  # the function's own output
        return CaseResult(None, "invalid", f"an output could not be decoded: {e}")


def verdict(results: list[CaseResult], classes: list[str], expected: list[list[torch.Tensor]],
            partial_credit: bool) -> tuple[Verdict, float]:
    """(the verdict, the fraction of cases passed): the verdict's score is 1.0 only when every case
    passes (or the fraction, with partial credit); its kind and reason are the first failing case's."""
    first, passed = None, 0
    for i, (result, name, outputs) in enumerate(zip(results, classes, expected)):
        if result.outputs is None:
            kind = "invalid_result" if result.status == "invalid" else FAILURES[result.status]
            case = Verdict(0.0, kind, False, False, False, False, result.reason)
        else:
            case = grade_outputs(result.outputs, outputs)
        passed += case.score == 1.0
        if case.score != 1.0 and first is None:
            first = (i, name, case)
    fraction = passed / len(results)
    if first is None:
        return Verdict(1.0, "pass", True, True, True, True, f"all {len(results)} hidden cases pass"), 1.0
    i, name, case = first
    score = fraction if partial_credit else 0.0
    reason = f"hidden case {i + 1} of {len(results)} ({name}) failed: {case.reason}; {passed} of {len(results)} pass"
    return Verdict(score, case.kind, case.result_present, case.shape_match, case.dtype_match, False, reason), fraction
