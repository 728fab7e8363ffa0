"""Lets the verifiers 0.4 tool server run commands in sandboxes that the eval process owns.

verifiers 0.4 serves tools from a separate process, but a local sandbox belongs to the process
that created it and dies with it. So the eval process keeps owning every sandbox (Task.setup
creates it, Task.finalize reads `result` back, PyTorchHarness.cleanup deletes it) and relays the two
tools' calls, a shell command (`execute_command`) and a cell (the transport's `run_cell` request), from
the tool server over a unix socket in a directory only its owner can enter. Sandbox processes
never see that directory. Nothing else crosses: no create, no preload, no read-back, no delete.
"""

import asyncio
import atexit
import json
import os
import shutil
import tempfile

from prime_sandboxes import CommandResponse, CommandTimeoutError, SandboxNotRunningError

from ptenv.inside.protocol import FRAME, MAX_FRAME


class RelayError(RuntimeError):
    """The relay itself failed: the eval process is gone, or a reply broke the protocol."""


class SandboxRelay:
    """Eval side: serves a transport's shell commands and cells to local processes that can open `path`."""

    def __init__(self, transport):
        self.transport = transport
        directory = tempfile.mkdtemp(prefix="ptenv-relay-")  # mode 0700
        atexit.register(shutil.rmtree, directory, True)
        self.path = os.path.join(directory, "relay.sock")
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self) -> None:
        """Listen on the running event loop (idempotent; a new loop gets a new listener)."""
        loop = asyncio.get_running_loop()
        if self._server is not None and self._loop is loop:
            return
        if os.path.exists(self.path):  # left by a listener whose event loop has ended
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._handle, self.path)
        self._loop = loop

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await read_frame(reader)
            reply = await self._execute(request) if request is not None else None
            if reply is not None:
                await write_frame(writer, reply)
        except (OSError, RelayError, asyncio.IncompleteReadError):
            pass  # the tool server went away mid-call; the command itself has ended or timed out
        finally:
            writer.close()

    async def _execute(self, request: dict) -> dict:
        try:
            if "code" in request:
                fields = {"code": request["code"]}
                return {"cell": await self.transport.call(request["sandbox_id"], "run_cell", fields, request["timeout"])}
            response = await self.transport.client.execute_command(
                request["sandbox_id"], request["command"], request["working_dir"], request["timeout"]
            )
        except CommandTimeoutError:
            return {"error": "timeout"}
        except SandboxNotRunningError as e:
            return {"error": "not_running", "message": str(e)}
        except Exception as e:  # reported to the tool, which turns it into the tool's error text
            return {"error": "failed", "message": f"{type(e).__name__}: {e}"}
        return {"stdout": response.stdout, "stderr": response.stderr, "exit_code": response.exit_code}


class RelayClient:
    """Tool-server side: prime_sandboxes' `execute_command` and a transport's `run_cell` call, answered by
    the eval process's sandboxes."""

    def __init__(self, path: str):
        self.path = path

    async def execute_command(
        self, sandbox_id: str, command: str, working_dir: str | None = None, timeout: float | None = None
    ) -> CommandResponse:
        request = {"sandbox_id": sandbox_id, "command": command, "working_dir": working_dir, "timeout": timeout}
        reply = await self._relay(sandbox_id, request, command)
        return CommandResponse(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"])

    async def call(self, sandbox_id: str, op: str, fields: dict, timeout: float) -> dict:
        """Transport.call for the tool server: cells only."""
        if op != "run_cell":
            raise RelayError(f"the relay serves cells and shell commands, not {op!r}")
        reply = await self._relay(sandbox_id, {"sandbox_id": sandbox_id, "code": fields["code"], "timeout": timeout}, op)
        return reply["cell"]

    async def _relay(self, sandbox_id: str, request: dict, what: str) -> dict:
        timeout = request["timeout"]
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
        except OSError as e:
            raise RelayError(f"cannot reach the sandbox relay at {self.path}: {e}") from None
        try:
            await write_frame(writer, request)
            reply = await read_frame(reader)
        except (OSError, asyncio.IncompleteReadError) as e:
            raise RelayError(f"the sandbox relay closed mid-call: {e}") from None
        finally:
            writer.close()
        if reply is None:
            raise RelayError("the sandbox relay closed without answering")
        error = reply.get("error")
        if error == "timeout":
            raise CommandTimeoutError(sandbox_id, what[:80], timeout)
        if error == "not_running":
            raise SandboxNotRunningError(sandbox_id, message=reply["message"])
        if error is not None:
            raise RelayError(reply["message"])
        return reply


async def write_frame(writer: asyncio.StreamWriter, obj: dict) -> None:
    payload = json.dumps(obj).encode()
    writer.write(FRAME.pack(len(payload)) + payload)
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader) -> dict | None:
    """One JSON object, or None at a clean end of stream."""
    header = await reader.read(FRAME.size)
    if not header:
        return None
    if len(header) < FRAME.size:
        header += await reader.readexactly(FRAME.size - len(header))
    (n,) = FRAME.unpack(header)
    if n > MAX_FRAME:
        raise RelayError(f"relay frame of {n} bytes is over the {MAX_FRAME}-byte cap")
    try:
        obj = json.loads(await reader.readexactly(n))
    except ValueError as e:
        raise RelayError(f"relay frame is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RelayError(f"relay frame is a {type(obj).__name__}, not an object")
    return obj
