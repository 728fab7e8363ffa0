"""Shared pieces of the sandbox tests: a sandbox with shortcuts, and helpers (the fixtures are in tests/conftest.py)."""

import os
import time

from prime_sandboxes import CreateSandboxRequest

from tests.support.proctree import sandbox_processes, supervisor_of
from ptenv.host.requests import parse_cell_reply, parse_result_doc
from ptenv.host.local import LocalSandboxClient

REQUEST = CreateSandboxRequest(name="test", docker_image="local")
# How many times slower than a native machine this one runs cells: scripts/test-guest's emulated
# guest sets it. The bounds below that a loaded native machine meets scale with it.
SLOWDOWN = float(os.environ.get("PTENV_TEST_SLOWDOWN", "1"))
CELL_TIMEOUT = 10.0 * SLOWDOWN  # generous: other suites may load the machine; timeout tests pass a shorter one
SHORT = 2.0
WAIT = 300.0  # a request's own bound when the test sets none: the cell time limit applies first
MEMORY_MB = 512


def wait_until(predicate, timeout: float = 5.0 * SLOWDOWN) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Box:
    """One sandbox with shortcuts for the three kinds of command."""

    def __init__(self, client: LocalSandboxClient, sandbox_id: str):
        self.client, self.id = client, sandbox_id
        self.supervisor = supervisor_of(client, sandbox_id)  # (host pid, start time)

    async def cell(self, code: str, timeout: float | None = None):
        """Run a cell; `timeout` below the client's cell time limit lowers it for this cell."""
        doc = await self.client.call(self.id, "run_cell", {"code": code}, timeout or WAIT)
        return parse_cell_reply(doc, self.client.limits)

    async def sh(self, command: str, timeout: float = 10 * SLOWDOWN, working_dir: str | None = None):
        return await self.client.execute_command(self.id, command, working_dir=working_dir, timeout=timeout)

    async def result(self):
        return parse_result_doc(await self.client.call(self.id, "read_result", {}, WAIT))

    def processes(self) -> list[int]:
        """Its supervisor's and the model's processes, as host pids (the supervisor first)."""
        return sandbox_processes(self.supervisor)


async def new_box(client: LocalSandboxClient) -> Box:
    return Box(client, (await client.create(REQUEST)).id)


async def only_the_sandbox_runs(box: Box) -> None:
    """Nothing a cell or command started is left: just the supervisor and the session."""
    assert wait_until(lambda: len(box.processes()) == 2), f"processes: {box.processes()}"
    assert (await box.cell("print('alive')")).stdout == "alive\n"
