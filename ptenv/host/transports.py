"""The two places a sandbox can live, behind one shape: a prime_sandboxes-like client, the create
request, and the few steps that differ (starting the session, where a trial runs, deleting leftovers
at teardown)."""

import contextlib
import logging
from dataclasses import dataclass
from typing import AsyncContextManager, Awaitable, Callable

from prime_sandboxes import CreateSandboxRequest

from ptenv.host.local import FDS_PER_ROLLOUT, LocalSandboxClient
from ptenv.inside.protocol import Limits

LOG = logging.getLogger("verifiers.pytorch_env")  # shown wherever verifiers' own log is
CELL_TIMEOUT = 30  # seconds one execute_code cell may run
LIMITS = Limits(cell_timeout=CELL_TIMEOUT)  # what each sandbox is allowed
COMMAND_TIMEOUT = 30  # seconds for one bash command, and for reading `result` back
CELL_MARGIN = 15  # past the cell limit: the session is restarted and the reply sent
IN_FLIGHT = 1024  # rollouts a trainer may keep in flight in one process: below room for this, say so


@dataclass(frozen=True)
class Transport:
    client: object  # the prime_sandboxes-like async client
    request: CreateSandboxRequest
    create_attempts: int
    wait_ready: Callable[[str], Awaitable[None]]  # sandbox id -> supervisor ready for preload
    delete_all: Callable[[list[str]], Awaitable[object]]  # teardown of leftovers
    # The model's bash command, working dir and timeout -> the command and working dir to execute,
    # so that it runs as the model (the local supervisor runs every shell that way already).
    model_shell: Callable[[str, str | None, float], tuple[str, str | None]]
    # The harness's own requests (ptenv.host.requests): (sandbox id, op, fields, timeout) -> the
    # reply document. A channel of its own: nothing the model's bash sends can reach it.
    call: Callable[[str, str, dict, float], Awaitable[dict]]
    # In force in every sandbox of this transport: the host reads the replies by the same limits
    # (the caps on them, how much output a cut notice says was kept).
    limits: Limits
    # (the rollout's sandbox id, whether the trial runs under an allowlist) -> where the trial runs,
    # the rollout's own sandbox or a fresh one, deleted after; the model's session has ended.
    trial_sandbox: Callable[[str, bool], AsyncContextManager[str]]
    command_timeout: int = COMMAND_TIMEOUT

    @property
    def cell_deadline(self) -> float:
        return self.limits.cell_timeout + CELL_MARGIN


def local(limits: Limits = LIMITS, allowlist_base: list[str] | None = None) -> Transport:
    client = LocalSandboxClient(limits, allowlist_base)
    LOG.info("pytorch-env local sandboxes: %s", client.isolation_mode)
    if client.open_files < IN_FLIGHT * FDS_PER_ROLLOUT:
        LOG.warning("pytorch-env: this process may open %d files (its hard limit), room for about %d rollouts in "
                    "flight; past that a sandbox cannot be created (raise it with `ulimit -Hn`)",
                    client.open_files, client.open_files // FDS_PER_ROLLOUT)

    async def supervisor_is_built_in(sandbox_id: str) -> None:
        """Local sandboxes start with their session running."""

    @contextlib.asynccontextmanager
    async def trial_sandbox(sandbox_id: str, allowlisted: bool):
        """A level-2 trial in a fresh sandbox of the trial zygote, which installed the widest
        allowlist once; any other in the rollout's own sandbox."""
        if not allowlisted or allowlist_base is None:
            yield sandbox_id
            return
        trial_id = await client.create_trial()
        try:
            yield trial_id
        finally:
            await client.delete(trial_id)

    return Transport(
        client=client,
        request=CreateSandboxRequest(name="pytorch-env", docker_image="local"),
        create_attempts=1,  # a local failure is deterministic: retrying only delays the error
        wait_ready=supervisor_is_built_in,
        delete_all=client.bulk_delete,
        model_shell=lambda command, cwd, timeout: (command, cwd),
        call=client.call,
        limits=limits,
        trial_sandbox=trial_sandbox,
    )


@contextlib.asynccontextmanager
async def in_place(sandbox_id: str, allowlisted: bool):
    """Every trial in the rollout's own sandbox (a Prime container: one per rollout, and slow to make)."""
    yield sandbox_id


def prime(limits: Limits = LIMITS, allowlist_base: list[str] | None = None) -> Transport:
    """`allowlist_base` is the local trial zygote's: a Prime container's callers install their allowlist whole."""
    # Imported here: the Prime client is only needed, and only available, with classic verifiers.
    from verifiers.legacy.utils.threaded_sandbox_client import ThreadedAsyncSandboxClient

    from ptenv.host import prime

    client = ThreadedAsyncSandboxClient()
    return Transport(
        client=client,
        request=prime.sandbox_request(limits),
        create_attempts=5,  # the service can fail transiently
        wait_ready=lambda sandbox_id: prime.wait_for_supervisor(client, sandbox_id),
        delete_all=prime.delete_all,
        model_shell=prime.model_shell,
        call=prime.command_call(client, limits),
        limits=limits,
        trial_sandbox=in_place,
    )


TRANSPORTS = {"local": local, "prime": prime}


def create(name: str, limits: Limits = LIMITS, allowlist_base: list[str] | None = None) -> Transport:
    """`allowlist_base`: the widest allowlist of the tasks' trials (tasks.tiers.allowlist_base)."""
    if name not in TRANSPORTS:
        raise ValueError(f"unknown sandbox {name!r}: choose one of {sorted(TRANSPORTS)}")
    return TRANSPORTS[name](limits, allowlist_base)
