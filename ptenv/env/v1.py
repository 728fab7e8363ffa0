"""pytorch-env on verifiers 0.4 (the rewritten `verifiers.v1` API): the classic adapter's tasks,
prompt, sandbox, session and grading, arranged the v1 way.

Where each part runs, and why:
- Task.setup (eval process) creates the rollout's sandbox and preloads the inputs. The sandbox id
  goes into the rollout's state, where the tool server finds it.
- `execute_code` and `bash` run inside that sandbox: one tool server per eval (ptenv.env.v1_tools)
  reaches it through the eval process's relay (ptenv.env.v1_relay). The agent program (v1 calls
  it a Harness) is v1's tool-less chat loop, so nothing the model writes runs on the host (v1's own
  `bash` program would run the model's commands on the host under the subprocess runtime).
- Task.finalize assesses the rollout on the host (ptenv.env.rollout). A wrong, missing or invalid
  answer scores 0.0; a harness fault (dead sandbox, unusable read-back) is a v1 failure instead: a
  SandboxError on the trace (ok False, no reward), its reason in trace.info["scoring_error"].
- PyTorchHarness.cleanup, which v1 runs after scoring and after every failure, deletes the sandbox.
- A reply whose tool call verifiers' chat program cannot pass on to the tool server (a lone
  surrogate in its arguments, an integer past 4300 digits) stops the rollout: see
  PyTorchTask.unsendable_tool_arguments.
"""

import json

import verifiers.v1 as vf
from verifiers.v1.harnesses.null.harness import NullHarness, NullHarnessConfig

from ptenv.env import rollout
from ptenv.env.prompt import FUNCTION_SYSTEM_PROMPT, SYSTEM_PROMPT
from ptenv.env.v1_relay import SandboxRelay
from ptenv.env.v1_tools import PyTorchState, PyTorchTools, PyTorchToolsConfig
from ptenv.env.versions import versions
from ptenv.host import transports
from ptenv.inside import codec
from ptenv.inside.protocol import one_line
from ptenv.tasks import functions, tiers
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, check_function_arguments
from ptenv.tasks.rows import TaskRow, parse_row
from ptenv.tasks.source import DEFAULT_DATASET, load_tasks

__all__ = ["PyTorchTaskset", "PyTorchHarness", "PyTorchV1Env"]

DIAGNOSTICS = ("result_present", "shape_match", "dtype_match", "values_match")

_sandboxes: tuple[transports.Transport, SandboxRelay] | None = None


def sandboxes() -> tuple[transports.Transport, SandboxRelay]:
    """This process's sandbox transport and the relay the tool server reaches it through."""
    global _sandboxes
    if _sandboxes is None:
        transport = transports.create("local", allowlist_base=tiers.allowlist_base())
        _sandboxes = (transport, SandboxRelay(transport))
    return _sandboxes


class PyTorchTaskData(vf.TaskData):
    info: dict  # the dataset row's info: encoded inputs and expected output, reference solution
    grading: dict  # function tasks: hidden_cases and partial_credit, from the taskset's config


class PyTorchTasksetConfig(vf.TasksetConfig):
    # The classic load_environment's arguments; v1 has no eval dataset, so `split` picks the one served.
    dataset_name: str = DEFAULT_DATASET
    split: str = "train"
    tiers: str | list[str] = "basic"
    families: str | list[str] | None = None
    num_train_examples: int = -1
    seed: int = 0
    kind: str = "result"
    level: int = 1
    hidden_cases: int = DEFAULT_HIDDEN_CASES
    partial_credit: bool = False


_draws: dict[str, rollout.Draw] = {}  # by trace id, from Task.setup to finalize (or cleanup)


def hidden_cases(n: int) -> functions.HiddenCases:
    """Function tasks' hidden cases, n per rollout, from the evaluation's secret: the process that
    loaded the taskset made it, and verifiers' env-server workers inherit it."""
    return functions.HiddenCases(rollout.evaluation_secret(), n)


class PyTorchHarnessConfig(NullHarnessConfig):
    pass


class PyTorchHarness(NullHarness, vf.Harness[PyTorchHarnessConfig]):
    """The agent program: v1's tool-less chat loop (`null`); the model's only tools are the sandboxed ones."""

    async def cleanup(self, trace: vf.Trace, runtime) -> None:
        # v1 runs this on every path (finalize and scoring are skipped after a failure), after
        # finalize has read `result` back: the one place where deleting the sandbox is always right.
        try:
            if not trace.ok and not trace.info.get("scoring_error"):
                # v1 skips finalize and scoring after a failure: record why, as finalize would have.
                reason = f"{trace.errors[-1].type}: {trace.errors[-1].message}" if trace.errors else "rollout failed"
                trace.info["scoring_error"] = one_line(reason)
            trace.record_metric("harness_error", float(not trace.ok))
        finally:
            draw = _draws.pop(trace.id, None)
            if draw is not None:  # the rollout failed before finalize
                draw.cases.cancel()
            if trace.state.sandbox_id is not None:
                await sandboxes()[0].client.delete(trace.state.sandbox_id)


class PyTorchTask(vf.Task[PyTorchTaskData, PyTorchState, vf.TaskConfig]):
    @property
    def key(self) -> str:
        return self.data.id  # the durable task id

    def row(self) -> TaskRow:
        return parse_row({"question": self.data.prompt, "info": self.data.info}, f"task {self.data.id}")

    async def setup(self, trace: vf.Trace, runtime) -> None:
        trace.info["versions"] = versions()  # trace.info, not the task's: parse_row takes exactly the dataset's keys
        if not isinstance(trace.agent.config.harness, PyTorchHarnessConfig):
            raise ValueError(
                f"pytorch-env runs with its own verifiers Harness (got {trace.agent.config.harness.id!r}): it keeps the "
                "model's code in the sandbox and deletes the sandbox afterwards; drop --env.agent.harness.id"
            )
        row = self.row()
        if draw := rollout.start_draw(row, hidden_cases(self.data.grading["hidden_cases"])):
            _draws[trace.id] = draw
            trace.info.update(draw.info)
        transport, relay = sandboxes()
        await relay.serve()
        try:
            sandbox = await transport.client.create(transport.request)
            trace.state.sandbox_id = sandbox.id  # from here on, PyTorchHarness.cleanup deletes it
            await transport.client.wait_for_creation(sandbox.id)
            await rollout.start_session(row, transport, sandbox.id)
        except Exception as e:
            raise vf.SandboxError(f"could not start the session: {one_line(e)}") from e

    async def finalize(self, trace: vf.Trace, runtime) -> None:
        transport, _ = sandboxes()
        settings = self.data.grading
        assessment = await rollout.assess_rollout(self.row(), transport, trace.state.sandbox_id,
                                                  final_message=trace.last_reply, draw=_draws.pop(trace.id, None),
                                                  partial_credit=settings["partial_credit"])
        trace.info.update(assessment.as_state())
        if assessment.scoring_error is not None:
            raise vf.SandboxError(assessment.scoring_error)

    @vf.stop
    async def unsendable_tool_arguments(self, response: vf.Response) -> bool:
        # verifiers 0.4's chat program dies on such a call before any code of ours sees it, and the
        # rollout would end as a harness fault (docs/threat-model.md). v1 runs this stop on the reply
        # before the chat program gets it: the model's call stays in the trace, and the rollout is
        # scored like any other stopped one, on the `result` it has left.
        return any(chat_program_fails_on(call.arguments) for call in response.message.tool_calls or [])

    @vf.reward(weight=1.0)
    async def correctness(self, trace: vf.Trace) -> float:
        return trace.info["verdict"]["score"]

    @vf.metric
    async def diagnostics(self, trace: vf.Trace) -> dict[str, float]:
        metrics = {key: float(trace.info["verdict"][key]) for key in DIAGNOSTICS}
        if "hidden_pass_fraction" in trace.info:
            metrics["hidden_pass_fraction"] = trace.info["hidden_pass_fraction"]
        return metrics


class PyTorchTaskset(vf.Taskset[PyTorchTask, PyTorchTasksetConfig]):
    def load(self):
        config = self.config
        check_function_arguments(config.hidden_cases, config.partial_credit)
        rollout.evaluation_secret()  # made here, before verifiers starts the workers that inherit it
        prompt = SYSTEM_PROMPT if config.kind == "result" else FUNCTION_SYSTEM_PROMPT
        grading = {"hidden_cases": config.hidden_cases, "partial_credit": config.partial_credit}
        for row in load_tasks(config.dataset_name, config.split, config.tiers, config.num_train_examples, config.seed,
                              kind=config.kind, level=config.level, families=config.families):
            data = PyTorchTaskData(id=row.task_id, prompt=row.question, system_prompt=prompt, info=row_info(row),
                                   grading=grading)
            yield PyTorchTask(data, self.config.task)

    @classmethod
    def toolsets(cls, config: PyTorchTasksetConfig) -> list[vf.Toolset]:
        transport, relay = sandboxes()
        tools = PyTorchToolsConfig(
            relay=relay.path, cell_deadline=transport.cell_deadline, command_timeout=transport.command_timeout,
            limits=transport.limits.as_dict(),
        )
        return [PyTorchTools(tools)]


def chat_program_fails_on(arguments: str) -> bool:
    """Whether verifiers 0.4's chat program fails on a tool call with these arguments before the call
    reaches a tool server. It decodes them with `json.loads` (an integer past Python's 4300-digit
    limit raises ValueError there) and sends an object on as UTF-8 JSON (httpx2), which cannot hold
    a lone surrogate: valid JSON such as `{"code": "\\ud800"}` decodes to one. Text that is not
    JSON, or JSON that is not an object, it answers with a tool error itself."""
    try:
        value = json.loads(arguments or "{}")
        if isinstance(value, dict):
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError:
        return False
    except ValueError:  # the digit limit, or UnicodeEncodeError
        return True
    except RecursionError:
        return False  # verifiers itself fails on these when it commits the reply, before any stop applies
    return False


def row_info(row: TaskRow) -> dict:
    """The row's `info` as in the dataset file: the codec round-trips tensors exactly."""
    return {
        "task_id": row.task_id,
        "category": row.category,
        "inputs": [{"name": name, "tensor": codec.encode(t)} for name, t in row.inputs.items()],
        "expected_output": codec.encode(row.expected),
        "reference_solution": row.reference_solution,
        **row.provenance(),
    }


class PyTorchEnvConfig(vf.SingleAgentEnvConfig):
    # The agent program runs no model code, so the host's subprocess runtime suits it (v1's default,
    # Prime, needs a Prime key); 5 turns as in the classic load_environment.
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig(), max_turns=5)


class PyTorchV1Env(vf.SingleAgentEnv, vf.Env[PyTorchEnvConfig]):
    """The single-agent env with this environment's defaults."""
