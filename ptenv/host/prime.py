"""Prime sandboxes: the same supervisor and interpreter as the local sandbox, in a python:3.11-slim container on
Prime's service. Only where the sandbox lives differs; every step is a prime_sandboxes call.

The container's start command unpacks ptenv/inside (shipped in an environment variable),
installs the CPU torch wheel of the host's torch version (so the references reproduce), puts the
`ptenv-request` client on PATH and starts the supervisor. Setup then waits until the server
answers; from there on the harness's requests are `ptenv-request` commands that Prime runs as
root (`command_call`), and the model's own bash commands go through it too (`model_shell`), to run
as the model's uid.
"""

import asyncio
import base64
import io
import json
import tarfile

import torch
from prime_sandboxes import CreateSandboxRequest, StartCommand

from ptenv import inside
from ptenv.host import requests
from ptenv.inside.protocol import MAX_FRAME, MAX_RESULT_REPLY, Limits, one_line

IMAGE = "python:3.11-slim"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
SUPERVISOR_SOCKET = "/run/ptenv.sock"
READY_TIMEOUT = 900  # seconds for the container to install torch and start the supervisor
READY_POLL = 2.0

START_SCRIPT = f"""\
set -e
mkdir -p /opt/ptenv
printf '%s' "$PTENV_INSIDE" | base64 -d | tar -xz -C /opt/ptenv
pip install --no-cache-dir --quiet --index-url {TORCH_INDEX} "torch==$PTENV_TORCH"
printf '#!/bin/sh\\nPYTHONPATH=/opt/ptenv exec python3 -m ptenv.inside.prime_cli "$@"\\n' > /usr/local/bin/ptenv-request
chmod +x /usr/local/bin/ptenv-request
cd /tmp
PYTHONPATH=/opt/ptenv exec python3 -m ptenv.inside.main serve {SUPERVISOR_SOCKET}
"""

READY_COMMAND = f"test -S {SUPERVISOR_SOCKET}"


def request_command(op: str, fields: dict) -> str:
    """A request to the supervisor as the command that runs ptenv/inside/prime_cli.py as root."""
    return f"ptenv-request {op} {base64.b64encode(json.dumps(fields).encode()).decode()}"


def model_shell(command: str, cwd: str | None, timeout: float) -> tuple[str, None]:
    """The model's bash command as `ptenv-request shell ...`: Prime runs commands as the container's
    root, the supervisor runs this one as the model's uid (supervisor.py, `serve`)."""
    return request_command("shell", {"command": command, "cwd": cwd, "timeout": timeout}), None


def command_call(client, limits: Limits):
    """Transport.call for Prime: the harness's requests as root-run `ptenv-request` commands."""

    async def call(sandbox_id: str, op: str, fields: dict, timeout: float) -> dict:
        reply = await client.execute_command(sandbox_id, request_command(op, {**fields, "timeout": timeout}), timeout=timeout)
        if reply.exit_code != 0:
            raise RuntimeError(f"`ptenv-request {op}` exited with {reply.exit_code}: {one_line(reply.stderr)}")
        cap = {"read_result": MAX_RESULT_REPLY, "trial": MAX_FRAME}.get(op, limits.cell_reply_cap)
        return requests.load_reply(reply.stdout, cap, op)

    return call


def torch_version() -> str:
    """The host's torch release without its local tag (2.13.0+cpu -> 2.13.0)."""
    return torch.__version__.split("+")[0]


def inside_archive() -> str:
    """The files of ptenv/inside as a base64 tar.gz, with fixed metadata so the payload is reproducible."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.USTAR_FORMAT) as tar:
        for rel in inside.FILES:
            data = (inside.SOURCE_ROOT / rel).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def sandbox_request(limits: Limits) -> CreateSandboxRequest:
    return CreateSandboxRequest(
        name="pytorch-env",
        docker_image=IMAGE,
        start_command=StartCommand(executable="sh", args=["-c", START_SCRIPT]),
        cpu_cores=1,
        memory_gb=2,
        disk_size_gb=5,
        timeout_minutes=60,
        environment_vars={
            "PTENV_INSIDE": inside_archive(),
            "PTENV_TORCH": torch_version(),
            "PTENV_LIMITS": json.dumps(limits.as_dict()),  # the supervisor enforces them (ptenv.inside.main)
        },
    )


async def wait_for_supervisor(client, sandbox_id: str, timeout: float = READY_TIMEOUT) -> None:
    """Poll until the supervisor listens (the container installs torch first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        reply = await client.execute_command(sandbox_id, READY_COMMAND, timeout=30)
        if reply.exit_code == 0:
            return
        if loop.time() >= deadline:
            raise TimeoutError(f"the supervisor of sandbox {sandbox_id} did not start within {timeout:g} s")
        await asyncio.sleep(READY_POLL)


async def delete_all(sandbox_ids: list[str]) -> None:
    """Bulk-delete leftovers with the synchronous client, as SandboxEnv's own teardown does."""
    from prime_sandboxes import APIClient, SandboxClient

    client = SandboxClient(APIClient())
    for start in range(0, len(sandbox_ids), 100):
        await asyncio.to_thread(client.bulk_delete, sandbox_ids=sandbox_ids[start : start + 100])
