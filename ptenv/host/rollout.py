"""Host side of one rollout over any prime_sandboxes-like client: preload the inputs,
run a cell, read `result` back and grade it. Both transports and both verifiers adapters use it.

The split that matters to a researcher: a wrong, missing or invalid answer is the model's (0.0,
no scoring_error); a sandbox that does not answer as the protocol says is the harness's
(0.0 with a one-line scoring_error).
"""

from dataclasses import asdict, dataclass

import torch

from ptenv.grader import Verdict, grade
from ptenv.host import commands
from ptenv.host.commands import one_line


class ProtocolError(RuntimeError):
    """The sandbox did not answer a session command as the protocol says (a harness failure)."""


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    scoring_error: str | None

    def as_state(self) -> dict:
        return {"verdict": asdict(self.verdict), "scoring_error": self.scoring_error}


async def _session_command(client, sandbox_id: str, command: str, timeout: float) -> str:
    reply = await client.execute_command(sandbox_id, command, timeout=timeout)
    if reply.exit_code != 0:
        op = command.split()[1]
        raise ProtocolError(f"`ptenv-session {op}` exited with {reply.exit_code}: {one_line(reply.stderr)}")
    return reply.stdout


async def preload(client, sandbox_id: str, inputs: dict[str, torch.Tensor], timeout: float) -> None:
    stdout = await _session_command(client, sandbox_id, commands.preload_command(inputs), timeout)
    reply = commands.parse_exec_reply(stdout)
    if reply.status != "ok":
        raise ProtocolError(f"preloading the inputs failed: {one_line(reply.stderr)}")


async def run_cell(client, sandbox_id: str, code: str, timeout: float) -> str:
    """The tool's answer to the model: output, traceback and any notice (stopped, reset, cut)."""
    stdout = await _session_command(client, sandbox_id, commands.exec_command(code), timeout)
    return commands.parse_exec_reply(stdout).text()


async def score(client, sandbox_id: str, expected: torch.Tensor, timeout: float) -> Outcome:
    """Read `result` back and grade it on the host. Never raises."""
    try:
        stdout = await _session_command(client, sandbox_id, commands.RESULT_COMMAND, timeout)
    except Exception as e:
        return harness_failure(f"reading result back failed: {type(e).__name__}: {one_line(e)}")
    try:
        answer = commands.parse_result_reply(stdout)
    except commands.ResultError as e:  # the model's own doing: it controls the session's process
        return Outcome(Verdict(0.0, True, False, False, False, str(e)), None)
    except Exception as e:
        return harness_failure(f"the result reply is unusable: {one_line(e)}")
    return Outcome(grade(answer, expected), None)


def harness_failure(reason: str) -> Outcome:
    return Outcome(Verdict(0.0, False, False, False, False, "not graded"), reason)


def error_chain(error: BaseException) -> str:
    """One line for an exception and what caused it (verifiers wraps the errors it stops on)."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        error = error.__cause__ or error.__context__
    return one_line(" <- ".join(parts))

