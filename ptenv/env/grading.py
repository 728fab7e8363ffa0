"""How a finished rollout is graded, shared by both verifiers adapters: a result task's `result`
against its expected output, or a function task's answer (in the final message) on its hidden cases."""

from ptenv.host import answer, rollout
from ptenv.host.transports import Transport
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.rows import TaskRow
from ptenv.tasks.tiers import find_family


async def grade(row: TaskRow, transport: Transport, sandbox_id: str, final_message: str, hidden: HiddenCases,
                partial_credit: bool) -> rollout.Outcome:
    """Never raises: a harness failure is an Outcome with a scoring_error."""
    if row.kind == "result":
        return await rollout.score(transport.call, sandbox_id, row.expected, transport.command_timeout)
    family = find_family(row.family)[1]
    try:
        cases = hidden.of(family, row.seed)
    except Exception as e:  # a family that cannot draw its cases is the harness's failure
        return rollout.harness_failure(f"drawing the hidden cases failed: {rollout.one_line(e)}")
    source = answer.function_source(final_message, row.function)
    return await rollout.score_function(transport.call, sandbox_id, source, row.function, cases, family.ban(row.level),
                                        transport.limits, partial_credit)
