"""The fixtures the sandbox tests share: the scripted policy server and a sandbox client per test
module, and a fresh sandbox per test."""

import pytest
import verifiers

from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import Limits
from tests.support.policy_server import serve_in_thread
from tests.support.sandbox import CELL_TIMEOUT, MEMORY_MB, new_box, wait_until

if hasattr(verifiers, "SandboxEnv"):  # the classic API (0.3.1): these modules need verifiers 0.4's
    collect_ignore = ["test_v1_env.py", "test_report_v1.py", "test_v1_scale.py"]


@pytest.fixture(scope="module")
def server():
    """The scripted policy server (reference, null, hostile, ...) on 127.0.0.1."""
    url, stop = serve_in_thread()
    yield url
    stop()


@pytest.fixture(scope="module")
def client():
    client = LocalSandboxClient(Limits(cell_timeout=CELL_TIMEOUT, memory_mb=MEMORY_MB))
    yield client
    client.teardown()


@pytest.fixture
async def box(client):
    """A fresh sandbox; afterwards it is deleted and none of its processes may be left."""
    box = await new_box(client)
    yield box
    await client.delete(box.id)
    assert wait_until(lambda: not box.processes()), f"left running: {box.processes()}"
