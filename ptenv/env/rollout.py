"""What both verifiers adapters do for one rollout: start its session and its hidden cases' draw,
and assess it once it ends, a result task or a function task, from the task's row."""

import asyncio
import os
import secrets
from dataclasses import dataclass

from ptenv.env.drawer import Drawer
from ptenv.host import answer, assess, requests
from ptenv.host.blame import HarnessFault, ModelFault
from ptenv.host.transports import Transport
from ptenv.inside.protocol import one_line
from ptenv.tasks import efficiency
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.rows import TaskRow
from ptenv.tasks.tiers import find_family

# Inherited by every process the loading process starts afterwards: verifiers' env-server workers
# (classic and 0.4 alike) draw from the same secret. Sandboxes start from a cleared environment.
SECRET_VARIABLE = "PTENV_HIDDEN_CASES_SECRET"


def evaluation_secret() -> str:
    """The secret every rollout's hidden cases are drawn from: made by the first process of an
    evaluation that loads the environment (vf-eval, a trainer's orchestrator), or set by the user
    to draw reproducibly (each rollout records its nonce)."""
    return os.environ.setdefault(SECRET_VARIABLE, secrets.token_hex(16))


DRAWER = Drawer()


@dataclass
class Draw:
    """A rollout's hidden cases, being drawn."""

    nonce: str
    secret_id: str
    cases: asyncio.Future

    @property
    def info(self) -> dict:
        """What the rollout records: with the secret, the nonce draws its cases again."""
        return {"hidden_nonce": self.nonce, "hidden_secret_id": self.secret_id}


def start_draw(row: TaskRow, cases: HiddenCases) -> Draw | None:
    """Start drawing a function task's hidden cases for this rollout alone (None for a result task):
    when the rollout starts, so that they are ready by its end."""
    if row.kind != "function":
        return None
    nonce = secrets.token_hex(8)
    future = DRAWER.submit("cases", cases.secret, cases.n, row.family, row.seed, nonce)
    return Draw(nonce, cases.secret_id, asyncio.wrap_future(future))


async def start_session(row: TaskRow, transport: Transport, sandbox_id: str) -> None:
    """Wait for the sandbox's supervisor, then preload the row's inputs."""
    await transport.wait_ready(sandbox_id)
    await requests.preload(transport.call, sandbox_id, row.inputs, timeout=transport.command_timeout,
                           limits=transport.limits)


async def assess_rollout(row: TaskRow, transport: Transport, sandbox_id: str, *, final_message: str,
                         draw: Draw | None, partial_credit: bool) -> assess.Assessment:
    """Never raises: a harness fault is an Assessment with a scoring_error."""
    if row.kind == "result":
        return await assess.assess_result(transport.call, sandbox_id, expected=row.expected,
                                          timeout=transport.command_timeout)
    family = find_family(row.family)[1]
    try:
        drawn = await draw.cases
    except Exception as e:  # a family that cannot draw its cases is the harness's failure
        return assess.assessment_of(HarnessFault("drawing the hidden cases", one_line(e)))
    try:
        # Off the event loop, which serves every other rollout: the search is linear but the text the model's.
        source = await asyncio.to_thread(answer.function_source, final_message, row.function)
        assess.check_source(source, row.function)
    except answer.MessageTooLong as e:
        return assess.assessment_of(ModelFault("invalid_result", str(e)), hidden_pass_fraction=0.0)
    except ModelFault as fault:
        return assess.assessment_of(fault, hidden_pass_fraction=0.0)
    allowlist = family.allowlist(row.level)
    budgets = None
    if row.level == efficiency.LEVEL:
        try:  # the expert implementation traced and run on each case's shapes: CPU, in the drawing process
            budgets = await asyncio.wrap_future(DRAWER.submit("budgets", row.family, drawn))
        except Exception as e:
            return assess.assessment_of(HarnessFault("the efficiency budget", one_line(e)))
    try:
        # Nothing of the model's session may run beside its trial, wherever the trial runs.
        await requests.end_session(transport.call, sandbox_id, timeout=transport.command_timeout)
        async with transport.trial_sandbox(sandbox_id, allowlist is not None) as trial_id:
            return await assess.assess_function(transport.call, trial_id, source=source, name=row.function,
                                                inputs=row.inputs, cases=drawn, allowlist=allowlist,
                                                limits=transport.limits, partial_credit=partial_credit,
                                                budgets=budgets)
    except Exception as fault:  # ending the session, or making or deleting the trial's sandbox
        return assess.assessment_of(fault)


def error_chain(error: BaseException) -> str:
    """One line for an exception and what caused it (verifiers wraps the errors it stops on)."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        error = error.__cause__ or error.__context__
    return one_line(" <- ".join(parts))
