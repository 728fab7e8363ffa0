"""One local sandbox, as vf-eval would make it: prints the mode line, what the fork server got and
a cell's output, or the one-line error that no sandbox could be made (scripts/guest/podman)."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prime_sandboxes import CreateSandboxRequest

from ptenv.host.local import LocalSandboxClient
from ptenv.host.requests import parse_cell_reply
from ptenv.host.view import SandboxUnavailableError


async def main() -> int:
    client = LocalSandboxClient()
    print(f"mode: {client.isolation_mode}", flush=True)
    try:
        sandbox = await client.create(CreateSandboxRequest(name="probe", docker_image="local"))
        doc = await client.call(sandbox.id, "run_cell", {"code": "print(torch.ones(2).sum().item())"}, 60)
        print(f"cgroup: {client.cgroup_mode}\ncell: {parse_cell_reply(doc, client.limits).stdout.strip()}")
        return 0
    except SandboxUnavailableError as e:
        print(f"error: {e}")
        return 1
    finally:
        client.teardown()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
