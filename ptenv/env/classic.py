"""The classic verifiers adapter (verifiers <= 0.3.1): PyTorchEnv on SandboxEnv, host-side grading in post_rollout."""

import json

import verifiers as vf
from datasets import Dataset
from verifiers.envs.sandbox_env import SandboxEnv

from ptenv.env import rollout
from ptenv.env.prompt import FUNCTION_SYSTEM_PROMPT, SYSTEM_PROMPT
from ptenv.host import answer, assess, requests, tool_input, transports
from ptenv.inside.protocol import model_text, one_line
from ptenv.tasks.source import DEFAULT_DATASET, load_tasks
from ptenv.tasks import functions
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, check_function_arguments
from ptenv.tasks.tiers import allowlist_base, check_num_eval_examples
from ptenv.env.versions import versions


class PyTorchEnv(SandboxEnv):
    """SandboxEnv with a persistent `execute_code` session and host-side grading in post_rollout."""

    def __init__(self, tasks, *, transport: transports.Transport, cases: functions.HiddenCases, partial_credit: bool,
                 **kwargs):
        self.tasks = {task.task_id: task for task in tasks}  # expected outputs stay in host memory
        self.transport = transport
        self.cases = cases  # function tasks' hidden cases, drawn on the host from a secret
        self.draws: dict[str, rollout.Draw] = {}  # by trajectory id, from setup_state to post_rollout
        self.partial_credit = partial_credit
        super().__init__(
            start_command=None,  # the transport's request says how a sandbox starts
            timeout_per_command_seconds=transport.command_timeout,
            max_retries=transport.create_attempts,
            **kwargs,
        )
        self.sandbox_client.teardown()  # SandboxEnv built a Prime client; ours replaces it
        self.sandbox_client = transport.client
        self.sandbox_request = transport.request
        self.add_tool(self.execute_code, args_to_skip=["sandbox_id", "sandbox_state"])

    async def setup_state(self, state: vf.State, **kwargs) -> vf.State:
        task = self.tasks[state["info"]["task_id"]]
        if draw := rollout.start_draw(task, self.cases):
            self.draws[state["trajectory_id"]] = draw
        state = await super().setup_state(state, **kwargs)
        sandbox_id = state["sandbox_id"]
        await self._wait_for_sandbox_ready(state["sandbox_state"], sandbox_id)
        try:
            await rollout.start_session(task, self.transport, sandbox_id)
        except Exception as e:
            raise vf.SandboxError(f"could not start the session: {one_line(e)}") from e
        return state

    async def bash(self, command: str, sandbox_id: str, sandbox_state, working_dir: str | None = None) -> str:
        """Execute `command` inside persistent sandbox container."""
        if error := tool_input.problem("command", command, shell=True):
            return error
        command, working_dir = self.transport.model_shell(command, working_dir, self.timeout_per_command_seconds)
        return model_text(await super().bash(command, sandbox_id, sandbox_state, working_dir))

    async def execute_code(self, code: str, sandbox_id: str, sandbox_state) -> str:
        """Run Python code in the persistent session. `torch` is imported, the task's input
        tensors are preloaded by name, and variables (including `result`) persist between calls.

        Args:
            code: Python source to run.
        """
        if error := tool_input.problem("code", code, shell=False):
            return error
        try:
            transport = self.transport
            return await requests.run_cell(transport.call, sandbox_id, code, timeout=transport.cell_deadline,
                                           limits=transport.limits)
        except Exception as e:  # the session did not answer: end the rollout, post_rollout says why
            raise vf.SandboxError(f"execute_code failed: {one_line(e)}") from e

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs) -> dict:
        updated = super().update_tool_args(tool_name, tool_args, messages, state, **kwargs)
        if tool_name == "execute_code":
            updated["sandbox_id"] = state["sandbox_id"]
            updated["sandbox_state"] = state["sandbox_state"]
        return updated

    async def post_rollout(self, state: vf.State):
        """Read `result` back and grade it on the host. Never raises: SandboxEnv deletes the sandbox after."""
        draw = self.draws.pop(state.get("trajectory_id"), None)  # a state built by hand may have none
        if draw is not None:
            state["info"].update(draw.info)
        if state.get("error") is not None:  # setup, a tool or the model endpoint failed: not the model's answer
            if draw is not None:
                draw.cases.cancel()  # not needed, if not begun
            assessment = assess.harness_fault(rollout.error_chain(state["error"]))
        else:
            assessment = await rollout.assess_rollout(
                self.tasks[state["info"]["task_id"]], self.transport, state["sandbox_id"],
                final_message=answer.final_message(state["completion"]), draw=draw,
                partial_credit=self.partial_credit)
            if assessment.scoring_error is not None:
                # A rollout error is what vf-eval and trainers mask; only the harness fails this way.
                state["error"] = vf.SandboxError(assessment.scoring_error)
        state.update(assessment.as_state())
        state["info"].update(assessment.as_state())  # info is in every saved sample: the report reads it there

    @vf.teardown
    async def teardown_sandboxes(self):
        # SandboxEnv's own teardown builds a Prime client (it needs a Prime key): the transport knows better.
        if self.active_sandboxes:
            await self.transport.delete_all(list(self.active_sandboxes))
            self.active_sandboxes.clear()


async def correctness(state) -> float:
    return state["verdict"]["score"]


def _diagnostic(key: str):
    async def metric(state) -> float:
        return float(state["verdict"][key])

    metric.__name__ = key
    return metric


async def harness_error(state) -> float:
    return float(state["scoring_error"] is not None)


async def hidden_pass_fraction(state) -> float:
    return float(state.get("hidden_pass_fraction") or 0.0)


def as_dataset(tasks) -> Dataset:
    stamp = versions()
    return Dataset.from_list([
        {"question": t.question,
         "info": json.dumps({"task_id": t.task_id, "category": t.category, **t.provenance(), "row": t.digest,
                             "versions": stamp})}
        for t in tasks
    ])


def load_environment(
    split: str = "train",
    dataset_name: str = DEFAULT_DATASET,
    max_turns: int = 5,
    sandbox: str = "local",
    tiers: str | list[str] = "basic",
    families: str | list[str] | None = None,
    num_train_examples: int = -1,
    num_eval_examples: int = 0,
    seed: int = 0,
    kind: str = "result",
    level: int = 1,
    hidden_cases: int = DEFAULT_HIDDEN_CASES,
    partial_credit: bool = False,
    **kwargs,
) -> vf.Environment:
    check_num_eval_examples(num_eval_examples, split)
    check_function_arguments(hidden_cases, partial_credit)
    tasks = load_tasks(dataset_name, split, tiers, num_train_examples, seed, kind=kind, level=level, families=families)
    # The held-out test split as the eval dataset, so a trainer's validation is not its training set.
    eval_tasks = load_tasks(dataset_name, "test", tiers, num_eval_examples, seed, "num_eval_examples", kind, level,
                            families) \
        if num_eval_examples else []
    diagnostics = [_diagnostic(key) for key in ("result_present", "shape_match", "dtype_match", "values_match")]
    metrics = [*diagnostics, harness_error] + ([hidden_pass_fraction] if kind == "function" else [])
    rubric = vf.Rubric(funcs=[correctness, *metrics], weights=[1.0] + [0.0] * len(metrics))
    return PyTorchEnv(
        tasks + eval_tasks,
        transport=transports.create(sandbox, allowlist_base=allowlist_base()),
        cases=functions.HiddenCases(rollout.evaluation_secret(), hidden_cases),
        partial_credit=partial_credit,
        dataset=as_dataset(tasks),
        eval_dataset=as_dataset(eval_tasks) if eval_tasks else None,
        system_prompt=SYSTEM_PROMPT if kind == "result" else FUNCTION_SYSTEM_PROMPT,
        rubric=rubric,
        max_turns=max_turns,
        **kwargs,
    )
