"""Host side of one rollout, over a transport's `call` (ptenv.host.transports): preload the
inputs, run a cell, read `result` back and grade it. Both transports and both verifiers adapters
use it.

The split that matters to a researcher: a wrong, missing or invalid answer is the model's (0.0,
no scoring_error); a sandbox that does not answer as the protocol says is the harness's
(0.0 with a one-line scoring_error).
"""

from dataclasses import asdict, dataclass, replace

import torch

from ptenv.grader import Verdict, grade, invalid_result
from ptenv.host import answer, commands, hidden
from ptenv.host.commands import ProtocolError, one_line
from ptenv.inside.protocol import Limits


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    scoring_error: str | None
    hidden_pass_fraction: float | None = None  # function tasks: the fraction of hidden cases passed

    def as_state(self) -> dict:
        state = {"verdict": asdict(self.verdict), "scoring_error": self.scoring_error}
        if self.hidden_pass_fraction is not None:
            state["hidden_pass_fraction"] = self.hidden_pass_fraction
        return state


async def preload(call, sandbox_id: str, inputs: dict[str, torch.Tensor], timeout: float, limits: Limits) -> None:
    doc = await call(sandbox_id, "preload", commands.preload_fields(inputs), timeout)
    reply = commands.parse_exec_reply(doc, limits)
    if reply.status != "ok":
        raise ProtocolError(f"preloading the inputs failed: {one_line(reply.stderr)}")


async def run_cell(call, sandbox_id: str, code: str, timeout: float, limits: Limits) -> str:
    """The tool's answer to the model: output, traceback and any notice (stopped, reset, cut), from
    a sandbox under `limits` (the transport's)."""
    doc = await call(sandbox_id, "exec", commands.exec_fields(code), timeout)
    return commands.parse_exec_reply(doc, limits).text()


async def score(call, sandbox_id: str, expected: torch.Tensor, timeout: float) -> Outcome:
    """Read `result` back and grade it on the host. Never raises."""
    try:
        doc = await call(sandbox_id, "result", {}, timeout)
    except Exception as e:
        return harness_failure(f"reading result back failed: {type(e).__name__}: {one_line(e)}")
    try:
        answer = commands.parse_result_reply(doc)
    except commands.ResultError as e:  # the model's own doing: it controls the session's process
        return Outcome(invalid_result(str(e)), None)
    except Exception as e:
        return harness_failure(f"the result reply is unusable: {one_line(e)}")
    return Outcome(grade(answer, expected), None)


async def score_function(call, sandbox_id: str, source: str | None, name: str, cases: list, ban: dict | None,
                         limits: Limits, partial_credit: bool) -> Outcome:
    """Run the answer's function on the hidden cases [(class, arguments, reference outputs)] in the
    sandbox, under the ban if any, and grade each on the host. Never raises."""
    if source is None:
        reason = f"no ```python block defining `{name}` in the final message"
        return Outcome(Verdict(0.0, "no_result", False, False, False, False, reason), None, 0.0)
    if len(source) > answer.MAX_ANSWER_CHARS:
        reason = f"the answer's code block has {len(source)} characters; at most {answer.MAX_ANSWER_CHARS} are run"
        return Outcome(Verdict(0.0, "invalid_result", True, False, False, False, reason), None, 0.0)
    timeout = limits.cell_timeout + len(cases) * (hidden.CALL_LIMIT + limits.grace) + limits.grace
    try:
        doc = await call(sandbox_id, "hidden", hidden.fields(source, name, [args for _, args, _ in cases], ban),
                         timeout)
    except Exception as e:
        return harness_failure(f"the hidden phase failed: {type(e).__name__}: {one_line(e)}")
    try:
        results, protected = hidden.parse_reply(doc, len(cases))
    except Exception as e:
        return harness_failure(f"the hidden-phase reply is unusable: {one_line(e)}")
    verdict, fraction = hidden.verdict(results, [c for c, _, _ in cases], [e for _, _, e in cases], partial_credit)
    if not protected:
        verdict = replace(verdict, reason=verdict.reason + " (ran with less protection: the OS did not refuse all the hidden phase refuses)")
    return Outcome(verdict, None, fraction)


def harness_failure(reason: str) -> Outcome:
    return Outcome(Verdict(0.0, "not_graded", False, False, False, False, "not graded"), reason)


def error_chain(error: BaseException) -> str:
    """One line for an exception and what caused it (verifiers wraps the errors it stops on)."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        error = error.__cause__ or error.__context__
    return one_line(" <- ".join(parts))

