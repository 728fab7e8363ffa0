"""Local sandbox transport: the calls verifiers' SandboxEnv makes on prime_sandboxes' async client
(create, wait_for_creation, execute_command, delete, bulk_delete, teardown), answered by sandboxes
on this machine (view.py), isolated with bubblewrap, Linux namespaces, cgroups and seccomp (the
process tree is in ptenv/inside/forkserver.py), kept ready by a pool (pool.py).
"""

import asyncio
import json
import resource
import socket
from datetime import datetime, timezone

from prime_sandboxes import (
    BulkDeleteSandboxResponse,
    CommandResponse,
    CommandTimeoutError,
    Sandbox,
    SandboxNotRunningError,
)

from ptenv.host.pool import Box, Pool
from ptenv.host.view import isolation_mode
from ptenv.inside.protocol import FRAME, Limits, one_line, recv_frame_async

# Host fds a rollout holds: its sandbox's channel, its model connection, and verifiers' own.
FDS_PER_ROLLOUT = 4
HOST_MARGIN = 5.0  # past a command's own deadline, the supervisor itself is considered hung
DEFAULT_TIMEOUT = 300.0  # prime_sandboxes' default per command


class LocalSandboxClient:
    """prime_sandboxes.AsyncSandboxClient's interface, as SandboxEnv uses it, on local sandboxes."""

    pool_size = 4  # idle sandboxes kept ready

    def __init__(self, limits: Limits = Limits(), allowlist_base: list[str] | None = None):
        self.limits = limits
        self.isolation_mode = isolation_mode()
        self.open_files = raise_open_file_limit()
        self.pool = Pool(limits, self.pool_size, allowlist_base)
        self._boxes: dict[str, Box] = {}

    @property
    def cgroup_mode(self) -> str:
        """What the kernel enforces per sandbox, once the fork server runs."""
        return self.pool.cgroup_mode

    # -- the SandboxEnv surface

    async def create(self, request) -> Sandbox:
        """A ready sandbox; `request` is a prime_sandboxes.CreateSandboxRequest (its Docker fields do not apply)."""
        box = await self.pool.take()
        self._boxes[box.id] = box
        now = datetime.now(timezone.utc)
        return Sandbox(
            id=box.id,
            name=request.name,
            docker_image=request.docker_image or "local",
            cpu_cores=1,
            memory_gb=self.limits.memory_mb / 1024,
            disk_size_gb=self.limits.scratch_mb / 1024,
            disk_mount_path="/tmp",
            gpu_count=0,
            status="RUNNING",
            timeout_minutes=request.timeout_minutes,
            labels=request.labels,
            created_at=now,
            updated_at=now,
        )

    async def create_trial(self) -> str:
        """A fresh sandbox from the trial zygote (no session), for a level-2 trial; delete it after."""
        box = await self.pool.take_trial()
        self._boxes[box.id] = box
        return box.id

    async def wait_for_creation(self, sandbox_id: str) -> None:
        self._live_box(sandbox_id)

    async def execute_command(
        self, sandbox_id: str, command: str, working_dir: str | None = None, timeout: float | None = None
    ) -> CommandResponse:
        """Run `command` with /bin/sh in the sandbox, as the model: only ever a shell command (the
        harness's own requests are typed, see `call`).

        Raises CommandTimeoutError when a shell command runs past `timeout` (its process group is
        killed), SandboxNotRunningError for an unknown, deleted or broken sandbox."""
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        reply = await self._request(sandbox_id, {"op": "shell", "command": command, "cwd": working_dir}, timeout)
        if reply.get("timed_out") is True:
            raise CommandTimeoutError(sandbox_id, one_line(command, 80), timeout)
        try:
            return CommandResponse(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"])
        except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
            box = self._boxes[sandbox_id]
            self._stop(box, "it sent a malformed reply")
            raise not_running(box) from None

    async def call(self, sandbox_id: str, op: str, fields: dict, timeout: float) -> dict:
        """The harness's own request `op` (preload, run_cell, read_result, end_session, trial: ptenv.host.requests)
        and its reply document, on a channel the model's commands never reach."""
        return await self._request(sandbox_id, {"op": op, **fields}, timeout)

    async def _request(self, sandbox_id: str, request: dict, timeout: float) -> dict:
        """The reply document to one request."""
        box = self._live_box(sandbox_id)
        reply = await self._roundtrip(box, {**request, "timeout": timeout}, timeout + self.limits.grace + HOST_MARGIN)
        if "error" in reply:  # the supervisor could not serve the request: the harness failed
            self._stop(box, one_line(reply["error"]))
            raise not_running(box)
        if not isinstance(reply.get("reply"), dict):
            self._stop(box, "it sent a malformed reply")
            raise not_running(box)
        return reply["reply"]

    async def delete(self, sandbox_id: str) -> dict:
        """Kill the sandbox and everything in it. An unknown id counts as already deleted, so a
        retried delete (SandboxEnv retries) succeeds."""
        await self._delete([self._boxes[sandbox_id]] if sandbox_id in self._boxes else [])
        return {"success": True, "id": sandbox_id}

    async def bulk_delete(self, sandbox_ids: list[str]) -> BulkDeleteSandboxResponse:
        await self._delete([self._boxes[i] for i in sandbox_ids if i in self._boxes])
        return BulkDeleteSandboxResponse(
            succeeded=list(sandbox_ids), failed=[], message=f"deleted {len(sandbox_ids)} sandboxes"
        )

    def teardown(self) -> None:
        """Kill the fork server and with it every sandbox (synchronous: SandboxEnv does not await it)."""
        for box in list(self._boxes.values()):
            self._stop(box, "the sandbox client was torn down")
            box.sock.close()
        self.pool.close()

    # -- sandboxes

    def _live_box(self, sandbox_id: str) -> Box:
        box = self._boxes.get(sandbox_id)
        if box is None:
            raise SandboxNotRunningError(sandbox_id, message=f"sandbox {sandbox_id} does not exist or was deleted")
        if box.dead:
            raise not_running(box)
        return box

    async def _roundtrip(self, box: Box, request: dict, wait: float) -> dict:
        loop = asyncio.get_running_loop()
        async with box.lock:
            if box.dead:
                raise not_running(box)
            request = {**request, "id": next(box.requests)}
            payload = json.dumps(request).encode()
            try:
                async with asyncio.timeout(wait):
                    await loop.sock_sendall(box.sock, FRAME.pack(len(payload)) + payload)
                    frame = await recv_frame_async(loop, box.sock)
            except TimeoutError:
                self._stop(box, f"it did not answer within {wait:g} s")
                raise CommandTimeoutError(box.id, one_line(request.get("command", request["op"]), 80), request["timeout"]) from None
            except (OSError, ValueError) as e:
                self._stop(box, f"its channel failed ({one_line(e)})")
                raise not_running(box) from None
            except BaseException:  # cancelled mid-command: the reply would come out of step
                self._stop(box, "a command was interrupted")
                raise
            if frame is None:
                self._stop(box, "its supervisor exited")
                raise not_running(box)
            try:
                reply = json.loads(frame)
            except ValueError:
                reply = None
            if not isinstance(reply, dict) or reply.get("id") != request["id"]:
                self._stop(box, "it sent a malformed reply")
                raise not_running(box)
            return reply

    def _stop(self, box: Box, reason: str) -> None:
        """Mark a sandbox dead and cut its channel: its supervisor exits on end of stream."""
        if box.dead is None:
            box.dead = reason
        try:
            box.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    async def _delete(self, boxes: list[Box]) -> None:
        if not boxes:
            return
        for box in boxes:
            self._stop(box, "it was deleted")
        await asyncio.to_thread(self.pool.kill, boxes)
        for box in boxes:
            async with box.lock:  # a command in flight has ended: its supervisor is gone
                box.sock.close()
            self._boxes.pop(box.id, None)



def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, and return it: each
    sandbox in use holds one of the host's fds, and a trainer keeps a thousand in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def not_running(box: Box) -> SandboxNotRunningError:
    return SandboxNotRunningError(box.id, message=f"sandbox {box.id} is not running: {box.dead}")
