"""A stand-in for Prime's sandbox service at the SDK boundary (prime_sandboxes.AsyncSandboxClient),
which cannot be reached from here. It records every call and payload, and plays each sandbox as a
"container" on this machine: bubblewrap gives it its own /opt, /run, /usr/local/bin and /tmp over
a read-only view of the host (whose Python has torch, as the image will once pip installed it), with
Docker's default capabilities, the request's start command runs there for real, as root, and each
execute_command runs `sh -c` in it. Only
`pip` is a stand-in, since there is no network: it records its arguments.
"""

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from prime_sandboxes import CommandResponse, CommandTimeoutError, SandboxNotRunningError

PIP_STANDIN = '#!/bin/sh\necho "$@" >> /tmp/pip-calls\nexit {code}\n'
MOUNTS = {"opt": "/opt", "run": "/run", "bin": "/usr/local/bin", "tmp": "/tmp"}
# What a process running as root in a Docker container may do by default (no ptrace, no mounts).
DOCKER_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
               "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")


class Container:
    def __init__(self, request, pip_exit_code: int):
        self.root = Path(tempfile.mkdtemp(prefix="fake-prime-"))
        for name in MOUNTS:
            (self.root / name).mkdir()
        (self.root / "tmp").chmod(0o1777)  # as in the image
        pip = self.root / "bin" / "pip"
        pip.write_text(PIP_STANDIN.format(code=pip_exit_code))
        pip.chmod(0o755)
        self.env = dict(request.environment_vars or {})
        start = request.start_command
        self.start = subprocess.Popen(self.argv([start.executable, *start.args]), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True)

    def argv(self, command: list[str]) -> list[str]:
        args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                "--die-with-parent", "--clearenv", "--cap-drop", "ALL"]
        for cap in DOCKER_CAPS:
            args += ["--cap-add", f"CAP_{cap}"]
        for name, target in MOUNTS.items():
            args += ["--bind", str(self.root / name), target]
        # The venv stands in for the image's Python with torch; keep it visible if it lives under /tmp.
        args += ["--ro-bind", sys.prefix, sys.prefix]
        path = f"/usr/local/bin:{Path(sys.executable).parent}:/usr/bin:/bin"
        for key, value in {**self.env, "PATH": path, "HOME": "/root"}.items():
            args += ["--setenv", key, value]
        return args + ["--chdir", "/", "--", *command]

    def stop(self) -> list[str]:
        """Stop everything in the container, remove it, and return what pip was asked to do."""
        if self.start.poll() is None:
            os.killpg(self.start.pid, signal.SIGKILL)
        self.start.wait()
        calls = self.root / "tmp" / "pip-calls"
        pip_calls = calls.read_text().splitlines() if calls.exists() else []
        shutil.rmtree(self.root, ignore_errors=True)
        return pip_calls


class FakePrimeService:
    """Shared by every client instance (verifiers makes one per worker thread)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.containers: dict[str, Container] = {}
        self.fail: dict[str, Exception] = {}  # step -> exception to raise there
        self.pip_calls: list[str] = []
        self.pip_exit_code = 0  # non-zero: the container's torch install fails
        self.lock = threading.Lock()

    def record(self, *call) -> None:
        with self.lock:
            self.calls.append(call)

    def check_failure(self, step: str) -> None:
        if step in self.fail:
            raise self.fail[step]

    def client_class(self):
        service = self

        class FakeAsyncSandboxClient:
            def __init__(self, *args, **kwargs):
                pass

            async def create(self, request):
                service.record("create", request)
                service.check_failure("create")
                sandbox_id = f"prime-{uuid.uuid4().hex[:12]}"
                service.containers[sandbox_id] = Container(request, service.pip_exit_code)
                return type("Sandbox", (), {"id": sandbox_id})()

            async def wait_for_creation(self, sandbox_id, **kwargs):
                service.record("wait_for_creation", sandbox_id)
                service.check_failure("wait_for_creation")

            async def execute_command(self, sandbox_id, command, working_dir=None, timeout=None, **kwargs):
                service.record("execute_command", sandbox_id, command, working_dir, timeout)
                service.check_failure(command.split()[1] if command.startswith("ptenv-request") else "shell")
                container = service.containers.get(sandbox_id)
                if container is None or container.start.poll() is not None:
                    raise SandboxNotRunningError(sandbox_id, message=f"sandbox {sandbox_id} is not running")
                process = await asyncio.create_subprocess_exec(
                    *container.argv(["sh", "-c", command]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    cwd="/", start_new_session=True,
                )
                try:
                    out, err = await asyncio.wait_for(process.communicate(), timeout)
                except TimeoutError:
                    process.kill()
                    await process.wait()
                    raise CommandTimeoutError(sandbox_id, command, timeout) from None
                return CommandResponse(stdout=out.decode(), stderr=err.decode(), exit_code=process.returncode)

            async def delete(self, sandbox_id):
                service.record("delete", sandbox_id)
                container = service.containers.pop(sandbox_id, None)
                if container is not None:
                    service.pip_calls += container.stop()
                return {"success": True}

        return FakeAsyncSandboxClient

    def steps(self) -> list[str]:
        """The calls in order, each named by its method (and a `ptenv-request` command by its op)."""
        names = []
        for call in self.calls:
            if call[0] == "execute_command" and call[2].startswith("ptenv-request"):
                names.append(call[2].split()[1])
            elif call[0] == "execute_command":
                names.append(f"sh: {call[2]}")
            else:
                names.append(call[0])
        return names

    def close(self) -> None:
        for container in self.containers.values():
            container.stop()
        self.containers.clear()

