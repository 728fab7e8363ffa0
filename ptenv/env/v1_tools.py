"""The verifiers 0.4 tool server: `execute_code` and `bash`, both run inside the rollout's sandbox.

verifiers starts this module once per eval (`python -m ptenv.env.v1_tools`, a taskset-wide server) and
tells each call which rollout it serves; the rollout's state names its sandbox. The commands go
through the eval process's relay (ptenv.env.v1_relay), which owns the sandboxes.
"""

import verifiers.v1 as vf
from prime_sandboxes import CommandTimeoutError

from ptenv.env.v1_relay import RelayClient
from ptenv.host import requests, tool_input
from ptenv.inside.protocol import Limits, model_text, one_line


class PyTorchState(vf.State):
    sandbox_id: str | None = None  # set by Task.setup; never shown to the model


class PyTorchToolsConfig(vf.SharedToolsetConfig):
    relay: str  # the eval process's relay socket
    cell_deadline: float
    command_timeout: float
    limits: dict  # the eval process's transport's Limits, as_dict: the cells' replies are read by them


class PyTorchTools(vf.Toolset[PyTorchToolsConfig, PyTorchState]):
    TOOL_PREFIX = None  # bare names: the model sees `execute_code` and `bash`, as with the classic adapter

    async def setup(self) -> None:
        self.sandbox = RelayClient(self.config.relay)
        self.limits = Limits(**self.config.limits)

    def _sandbox_id(self) -> str:
        if self.state.sandbox_id is None:
            raise RuntimeError("this rollout has no sandbox")
        return self.state.sandbox_id

    @vf.tool
    async def execute_code(self, code: str) -> str:
        """Run Python code in the persistent session. `torch` is imported, the task's inputs are
        preloaded by name, and variables (including `result`) persist between calls.

        Args:
            code: Python source to run.
        """
        if error := tool_input.problem("code", code, shell=False):
            return error
        try:
            sandbox_id = self._sandbox_id()
            return await requests.run_cell(self.sandbox.call, sandbox_id, code, timeout=self.config.cell_deadline,
                                           limits=self.limits)
        except Exception as e:  # v1 shows the model the error; finalize then finds the sandbox broken
            raise RuntimeError(f"the sandbox did not answer: {one_line(e)}") from None

    @vf.tool
    async def bash(self, command: str) -> str:
        """Run a shell command in the sandbox (the same machine and files as execute_code).

        Args:
            command: the command, run with /bin/sh.
        """
        if error := tool_input.problem("command", command, shell=True):
            return error
        timeout = self.config.command_timeout
        try:
            response = await self.sandbox.execute_command(self._sandbox_id(), command, timeout=timeout)
        except CommandTimeoutError:
            return f"Error: Command timed out after {timeout:g}s"
        except Exception as e:
            raise RuntimeError(f"the sandbox did not answer: {one_line(e)}") from None
        # The classic SandboxEnv's `bash` answers in this form; keep the two adapters alike.
        output = response.stdout
        if response.stderr:
            output += f"\nstderr:\n{response.stderr}"
        return model_text(output) or "(no output)"


if __name__ == "__main__":
    PyTorchTools.run()
