"""The verifiers 0.4 adapter (ptenv.env.v1): one task's setup, finalize, scoring and cleanup in
process, then the real 0.4 `vf-eval` against the scripted policy server on 127.0.0.1.

Runs where verifiers 0.4 is installed; on the classic venv tests/conftest.py leaves it out.
"""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import verifiers.v1 as vf
from prime_sandboxes import CommandTimeoutError
from verifiers.v1.harnesses.null.harness import NullHarnessConfig

from ptenv.host.blame import HarnessFault
from ptenv.host import requests
from tests.support import ban_answers, hostile_functions, policy_server
from ptenv.tasks.rows import dumps_rows
from ptenv.tasks.tiers import select
from tests.support.sandbox import wait_until
from ptenv.env.v1 import (
    DIAGNOSTICS,
    PyTorchHarness,
    PyTorchHarnessConfig,
    PyTorchTaskset,
    PyTorchTasksetConfig,
    chat_program_fails_on,
    sandboxes,
)
from ptenv.env.v1_relay import RelayClient, RelayError
from ptenv.env.v1_tools import PyTorchState

pytestmark = pytest.mark.v1

N_TASKS = 45
VF_EVAL_TIMEOUT = 280  # a 45-rollout run takes about 80 s on 2 cores


@pytest.fixture(scope="module")
def task():
    return next(iter(PyTorchTaskset(PyTorchTasksetConfig())))


def new_trace(task, harness=None) -> vf.Trace:
    harness = harness or PyTorchHarnessConfig(id="pytorch-env")
    return vf.Trace(
        agent=vf.AgentInfo(config=vf.AgentConfig(harness=harness)),
        task=vf.TraceTask(type=type(task).__name__, data=task.data),
        state=PyTorchState(),
    )


async def cell(trace, code: str) -> str:
    """Run a cell the way the tool server does: through the relay, by the sandbox id in the state."""
    transport, relay = sandboxes()
    call = RelayClient(relay.path).call
    return await requests.run_cell(call, trace.state.sandbox_id, code, timeout=transport.cell_deadline, limits=transport.limits)


async def close(trace) -> None:
    """What the rollout does last: mark the trace failed if an error was recorded, run the harness cleanup."""
    trace.ok = not trace.errors
    await PyTorchHarness(PyTorchHarnessConfig(id="pytorch-env")).cleanup(trace, None)


@pytest.mark.slow
async def test_setup_preloads_every_input_by_name(task):
    trace = new_trace(task)
    await task.setup(trace, None)
    try:
        inputs = task.row().inputs
        code = "".join(
            f"print({name!r}, torch.equal({name}, torch.tensor({t.tolist()!r}, dtype={t.dtype})))\n"
            for name, t in inputs.items()
        )
        assert (await cell(trace, code)).splitlines() == [f"{name} True" for name in inputs]
    finally:
        await close(trace)


@pytest.mark.slow
async def test_finalize_grades_the_reference_answer_and_cleanup_deletes_the_sandbox(task):
    trace = new_trace(task)
    await task.setup(trace, None)
    await cell(trace, task.row().reference_solution)
    await task.finalize(trace, None)
    await task.score(trace, None)
    await close(trace)

    assert trace.info["scoring_error"] is None
    assert trace.rewards["correctness"].score == 1.0 and trace.reward == 1.0
    assert trace.metrics == {**{key: 1.0 for key in DIAGNOSTICS}, "harness_error": 0.0}
    with pytest.raises(HarnessFault, match="SandboxNotRunningError: .* deleted"):
        await cell(trace, "print(1)")


@pytest.mark.slow
async def test_a_wrong_answer_scores_zero_without_a_harness_error(task):
    trace = new_trace(task)
    await task.setup(trace, None)
    expected = task.row().expected
    try:
        await cell(trace, f"result = torch.zeros({tuple(expected.shape)}, dtype={expected.dtype})")
        await task.finalize(trace, None)
        await task.score(trace, None)
    finally:
        await close(trace)
    assert trace.info["scoring_error"] is None
    assert trace.rewards["correctness"].score == 0.0
    assert trace.metrics["shape_match"] == trace.metrics["dtype_match"] == 1.0
    assert trace.metrics["values_match"] == 0.0
    assert trace.info["verdict"]["reason"].startswith("values:")


@pytest.mark.slow
async def test_a_dead_sandbox_at_finalize_is_a_typed_failure_with_its_reason_recorded(task):
    trace = new_trace(task)
    await task.setup(trace, None)
    await cell(trace, task.row().reference_solution)
    await sandboxes()[0].client.delete(trace.state.sandbox_id)  # the sandbox dies before the read-back

    with pytest.raises(vf.SandboxError) as failure:
        await task.finalize(trace, None)
    trace.record_error(failure.value)  # what the rollout does with it: the trace fails, unscored
    await close(trace)

    assert trace.info["scoring_error"].startswith("reading result back failed: SandboxNotRunningError")
    assert str(failure.value) == trace.info["scoring_error"]
    assert trace.ok is False and trace.errors[-1].type == "SandboxError"
    assert trace.rewards == {} and trace.metrics == {"harness_error": 1.0}


@pytest.mark.slow
async def test_the_relay_passes_replies_and_timeouts_through(task):
    trace = new_trace(task)
    await task.setup(trace, None)
    relay = RelayClient(sandboxes()[1].path)
    try:
        reply = await relay.execute_command(trace.state.sandbox_id, "echo out; echo err >&2; exit 3", timeout=10)
        assert (reply.stdout, reply.stderr, reply.exit_code) == ("out\n", "err\n", 3)
        with pytest.raises(CommandTimeoutError):
            await relay.execute_command(trace.state.sandbox_id, "sleep 10", timeout=0.5)
        cell = await relay.call(trace.state.sandbox_id, "run_cell", {"code": "print(6 * 7)"}, 10)
        assert cell["stdout"] == "42\n" and cell["status"] == "ok"
        for op in ("read_result", "preload"):  # the read-back and the inputs stay the eval process's
            with pytest.raises(RelayError, match=f"not '{op}'"):
                await relay.call(trace.state.sandbox_id, op, {}, 10)
    finally:
        await close(trace)


async def test_setup_refuses_another_harness_before_creating_a_sandbox(task):
    trace = new_trace(task, harness=NullHarnessConfig(id="null"))
    with pytest.raises(ValueError, match="its own verifiers Harness"):
        await task.setup(trace, None)
    assert trace.state.sandbox_id is None


# --- the real verifiers 0.4 CLI --------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_url():
    url, stop = policy_server.serve_in_thread()
    yield url
    stop()


def run_vf_eval(url: str, policy: str, out: Path, n: int, taskset_args: tuple = (), rollouts: int = 1,
                timeout: float = VF_EVAL_TIMEOUT) -> list[dict]:
    """`vf-eval pytorch-env` as a user runs it; returns the traces, after checking nothing outlived it."""
    marker = uuid.uuid4().hex
    bin_dir = Path(sys.executable).parent  # vf-eval, and the `uv` its harness program needs
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PTENV_TEST_RUN": marker}
    argv = [str(bin_dir / "vf-eval"), "pytorch-env", "-m", policy, "--client.base-url", url,
            "-n", str(n), "-r", str(rollouts), "--no-push", "--no-rich", "-o", str(out), "--run.dir", "run", *taskset_args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wait_until(lambda: not processes_marked(marker), 10), f"left running: {processes_marked(marker)}"
    episodes = [json.loads(line) for line in (out / "run" / "traces.jsonl").read_text().splitlines()]
    return [trace for episode in episodes for trace in episode["traces"]]


def score(trace: dict) -> float | None:
    """The correctness reward of a serialized trace; None when the rollout failed unscored."""
    return (trace["rewards"].get("correctness") or {}).get("score")


def processes_marked(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (everything vf-eval started, sandboxes' bwrap too)."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if f"PTENV_TEST_RUN={marker}".encode() in f.read().split(b"\0"):
                    with open(f"/proc/{name}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            pids.append(int(name))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.slow
def test_vf_eval_reference_policy_scores_45_of_45(policy_url, tmp_path):
    traces = run_vf_eval(policy_url, "reference", tmp_path, N_TASKS)
    assert len({t["task"]["data"]["id"] for t in traces}) == len(traces) == N_TASKS
    failed = [(t["task"]["data"]["id"], t["info"]) for t in traces if not (t["ok"] and score(t) == 1.0)]
    assert failed == []
    assert all(t["info"]["scoring_error"] is None and t["metrics"]["harness_error"] == 0.0 for t in traces)


@pytest.mark.slow
def test_vf_eval_null_policy_scores_0_of_45_without_a_harness_error(policy_url, tmp_path):
    traces = run_vf_eval(policy_url, "null", tmp_path, N_TASKS)
    assert len(traces) == N_TASKS
    assert all(t["ok"] and score(t) == 0.0 for t in traces)
    assert all(t["info"]["scoring_error"] is None and t["info"]["verdict"]["reason"] == "no result" for t in traces)


@pytest.mark.slow
def test_vf_eval_malformed_tool_calls_leave_the_rollout_whole(policy_url, tmp_path, monkeypatch):
    # The malformed calls are tool messages the model reads (v1 checks types itself; text and the
    # harness's own requests are ours); the reference solution then scores 1.0 in the same sandbox.
    # Not the calls with a lone surrogate: verifiers 0.4 cannot pass them on to a tool server, so they
    # stop the rollout (test_vf_eval_a_call_verifiers_cannot_send_stops_the_rollout_as_the_models).
    calls = [c for c in policy_server.MALFORMED_CALLS if not chat_program_fails_on(json.dumps(c[1]))]
    assert len(policy_server.MALFORMED_CALLS) - len(calls) == 2
    monkeypatch.setattr(policy_server, "MALFORMED_CALLS", calls)
    (trace,) = run_vf_eval(policy_url, "malformed", tmp_path, 1)
    assert trace["ok"] and score(trace) == 1.0, trace["info"]
    assert trace["info"]["scoring_error"] is None and trace["metrics"]["harness_error"] == 0.0
    text = json.dumps(trace)
    assert "contains a NUL byte" in text and "ptenv-request: not found" in text and "ValueError: \\\\ud800" in text


# Tool calls verifiers 0.4's chat program fails on before they reach the tool server (docs/threat-model.md):
# the lone surrogates of MALFORMED_CALLS, and a valid JSON integer past Python's 4300-digit limit.
UNSENDABLE = [(name, json.dumps(arguments)) for name, arguments in policy_server.MALFORMED_CALLS
              if chat_program_fails_on(json.dumps(arguments))] + [("execute_code", '{"code": ' + "7" * 4301 + "}")]


def test_chat_program_fails_on_lone_surrogates_and_huge_integers_only():
    assert all(chat_program_fails_on(arguments) for _, arguments in UNSENDABLE)
    assert chat_program_fails_on('{"code": "print(1)", "more": [{"x": "\\udfff"}]}')
    # Not JSON or not an object (the chat program answers these), a surrogate pair, an escaped
    # backslash, NaN (sent as null), and nesting too deep, on which verifiers fails first (open).
    handled = ['{"code": "\\ud800"', '["\\ud800"]', "", "null", '{"code": "\\ud83d\\ude00"}',
               '{"code": "raise ValueError(\'\\\\ud800\')"}', '{"code": NaN}', '{"code": ' + "[" * 5000 + "]" * 5000 + "}"]
    assert not any(map(chat_program_fails_on, handled))


def unsendable_policy(row, messages, tools):
    """Row i < len(UNSENDABLE) sends call i first. The next row first leaves the right answer, then
    sends the first call: a stopped rollout is scored on the `result` it has left."""
    position = row["position"]
    if position == len(UNSENDABLE) and messages[-1]["role"] != "tool":
        return call("execute_code", code=row["info"]["reference_solution"])
    name, arguments = UNSENDABLE[position % len(UNSENDABLE)]
    tool_call = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [tool_call]}


@pytest.mark.slow
def test_vf_eval_a_call_verifiers_cannot_send_stops_the_rollout_as_the_models(policy_url, tmp_path, monkeypatch):
    # verifiers 0.4's chat program would die on these calls (the next test), a harness error. The
    # task's Response stop ends the rollout on the reply before the program gets it: no scoring_error,
    # the model's call kept as its last message, the score that of its `result`.
    monkeypatch.setitem(policy_server.POLICIES, "unsendable", unsendable_policy)
    traces = run_vf_eval(policy_url, "unsendable", tmp_path, len(UNSENDABLE) + 1)
    assert len(traces) == len(UNSENDABLE) + 1
    sent = []
    for trace in traces:
        assert trace["ok"] and trace["stop_condition"] == "unsendable_tool_arguments", trace["errors"]
        assert trace["info"]["scoring_error"] is None and trace["metrics"]["harness_error"] == 0.0
        last = trace["nodes"][-1]["message"]
        (tool_call,) = last["tool_calls"]
        sent.append((tool_call["name"], tool_call["arguments"]))
        answered = any(n["message"]["role"] == "tool" for n in trace["nodes"])
        assert score(trace) == float(answered), trace["info"]["verdict"]
        assert answered or trace["info"]["verdict"]["reason"] == "no result"
    assert sorted(sent) == sorted(UNSENDABLE + UNSENDABLE[:1])


@pytest.mark.slow
def test_vf_eval_without_the_stop_verifiers_fails_the_rollout_on_a_lone_surrogate(policy_url, tmp_path, monkeypatch):
    # What unsendable_tool_arguments prevents; once this fails, verifiers passes such calls on and the
    # stop can go. The chat program's MCP client cannot encode the call as UTF-8 (httpx2's
    # encode_json raises UnicodeEncodeError in its post task), the connection closes, and after 6
    # attempts the program exits 1 with "MCPError: Connection closed": a HarnessError, unscored.
    monkeypatch.setitem(policy_server.POLICIES, "unsendable", unsendable_policy)
    never = Path(__file__).parent / "support" / "v1_no_stop.py"
    plug = json.dumps({"unsendable_tool_arguments": {"fn": f"{never}:never"}})
    (trace,) = run_vf_eval(policy_url, "unsendable", tmp_path, 1, ("--env.taskset.task.stops", plug))
    assert not trace["ok"] and trace["stop_condition"] == "harness_error" and trace["rewards"] == {}
    assert "MCPError: Connection closed" in trace["errors"][-1]["message"]
    assert trace["info"]["scoring_error"].startswith("HarnessError: harness 'pytorch-env' exited 1")


def test_the_taskset_serves_a_generated_tier_and_split_with_provenance():
    tasks = list(PyTorchTaskset(PyTorchTasksetConfig(tiers="advanced", split="test", num_train_examples=3, seed=5)))
    rows = [task.row() for task in tasks]
    assert [r.task_id for r in rows] == [i.id for i in select(["advanced"], "test", 3, 5)]
    assert all(r.tier == "advanced" and r.seed % 2 == 1 and r.task_id == f"{r.family}@{r.seed}" for r in rows)
    with pytest.raises(ValueError, match=r"^tiers must be one of 'basic', 'intermediate', 'advanced', 'expert'"):
        list(PyTorchTaskset(PyTorchTasksetConfig(tiers="master")))
    chosen = PyTorchTasksetConfig(tiers="advanced", split="test", families=["nn_modules/soft_pool2d_fn"], kind="function")
    assert {task.row().family for task in PyTorchTaskset(chosen)} == {"nn_modules/soft_pool2d_fn"}


@pytest.mark.slow
def test_vf_eval_reference_policy_scores_generated_test_rows(tmp_path):
    instances = select(["intermediate"], "test", 4, 5)
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(dumps_rows([i.row() for i in instances]))  # so the reference policy knows their solutions
    url, stop = policy_server.serve_in_thread(dataset)
    try:
        args = ("--env.taskset.tiers", "intermediate", "--env.taskset.split", "test",
                "--env.taskset.num-train-examples", "4", "--env.taskset.seed", "5")
        traces = run_vf_eval(url, "reference", tmp_path / "out", 4, args)
    finally:
        stop()
    assert sorted(t["task"]["data"]["id"] for t in traces) == sorted(i.id for i in instances)
    assert all(t["ok"] and score(t) == 1.0 for t in traces)
    assert all(t["task"]["data"]["info"]["tier"] == "intermediate" for t in traces)


@pytest.mark.slow
def test_bash_runs_in_the_cells_sandbox_and_not_on_the_host(policy_url, tmp_path, monkeypatch):
    def probe(row, messages, tools):
        """bash writes a file and looks around; a cell reads the file back, then answers."""
        done = sum(m["role"] == "tool" for m in messages)
        if done == 0:
            return call("bash", command=f"echo 6 > /tmp/n; id -u; ls {Path.cwd()} 2>&1")
        if done == 1:
            return call("execute_code", code="assert open('/tmp/n').read() == '6\\n'\n" + row["info"]["reference_solution"])
        return {"role": "assistant", "content": "done"}

    monkeypatch.setitem(policy_server.POLICIES, "probe", probe)
    (trace,) = run_vf_eval(policy_url, "probe", tmp_path, 1)
    bash_output = [n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "tool"][0]
    uid, listing = bash_output.split("\n", 1)
    assert int(uid) != os.getuid()
    assert "No such file or directory" in listing  # the repo is not there
    assert trace["ok"] and score(trace) == 1.0  # the cell saw the file bash wrote


def call(name: str, **arguments) -> dict:
    tool_call = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [tool_call]}


@pytest.mark.slow
def test_vf_eval_grades_function_tasks_on_hidden_inputs(tmp_path):
    count = len(hostile_functions.ANSWERS)
    instances = select(["intermediate"], "train", count, 0, "function", 1)
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(dumps_rows([i.row() for i in instances]))
    url, stop = policy_server.serve_in_thread(dataset)
    args = ("--env.taskset.tiers", "intermediate", "--env.taskset.kind", "function",
            "--env.taskset.num-train-examples", str(count))
    try:
        right = run_vf_eval(url, "reference", tmp_path / "right", count, args)
        partial = run_vf_eval(url, "function_hostile", tmp_path / "hostile", count,
                              args + ("--env.taskset.partial-credit", "true"))
    finally:
        stop()
    assert len(right) == len(partial) == count
    for trace in right:
        assert trace["ok"] and score(trace) == 1.0, trace["info"]
        assert trace["metrics"]["hidden_pass_fraction"] == 1.0
        assert trace["task"]["data"]["system_prompt"].startswith("You write PyTorch functions")
    for trace in partial:
        where = (trace["task"]["data"]["id"], trace["info"]["verdict"])
        assert trace["ok"] and score(trace) == trace["metrics"]["hidden_pass_fraction"] == 0.0, where
        assert trace["info"]["scoring_error"] is None and trace["metrics"]["harness_error"] == 0.0, where
        assert trace["info"]["verdict"]["reason"].startswith(("hidden case", "no ```python block", "the answer's code block")), where


@pytest.mark.slow
def test_vf_eval_scores_every_way_around_the_ban_zero(tmp_path):
    """tests/test_ban_hostile.py's vf-eval run on this line: the rows are named (--select.include.idx)."""
    from tests import test_ban_hostile as ban

    played = ban.played_rows(tmp_path / "rows.jsonl")
    url, stop = policy_server.serve_in_thread(tmp_path / "rows.jsonl")
    args = ("--env.taskset.tiers", "expert", "--env.taskset.kind", "function", "--env.taskset.level", "2",
            "--env.taskset.num-train-examples", str(ban.ROWS), "--select.include.idx", ",".join(map(str, ban.PLAYED)),
            "-c", "6")
    try:
        traces = run_vf_eval(url, "ban_hostile", tmp_path / "out", len(ban.PLAYED), args, ban.ROLLOUTS, 900)
    finally:
        stop()
    assert len(traces) == len(ban.PLAYED) * ban.ROLLOUTS
    assert {t["task"]["data"]["id"] for t in traces} == {i.id for i in played}
    assert all(t["ok"] and t["metrics"]["harness_error"] == 0.0 for t in traces), [t["info"] for t in traces if not t["ok"]]
    finals = [[n["message"] for n in t["nodes"] if n["message"]["role"] == "assistant"][-1]["content"] for t in traces]
    ban.check_played([(ban_answers.played(final), t["info"]["verdict"], score(t), t["info"]["scoring_error"])
                      for final, t in zip(finals, traces)])


@pytest.mark.slow
@pytest.mark.parametrize("channel", ["locks"])
def test_vf_eval_a_channel_carries_a_writers_cases_and_the_reader_gains_nothing(tmp_path, channel):
    """tests/test_cross_rollout.py's vf-eval runs on this line: the record-lock channel. The page
    cache's reader on this line read 2 of the writer's 8 cases once per-rollout cases were in (it
    read all 8 before, and scored 1.0): not explained yet, so its replay is classic's alone."""
    from tests import test_cross_rollout as replay
    from tests.support.cross_rollout import clear_page_cache

    (tmp_path / "rows.jsonl").write_text(dumps_rows([replay.ROW.row()]))
    clear_page_cache()
    url, stop = policy_server.serve_in_thread(tmp_path / "rows.jsonl")
    args = ("--env.taskset.tiers", "basic", "--env.taskset.kind", "function", "--env.taskset.level", "2",
            "--env.taskset.num-train-examples", "1", "-c", str(replay.ROLLOUTS))
    try:
        traces = run_vf_eval(url, f"cross_rollout_{channel}", tmp_path / "out", 1, args, replay.ROLLOUTS)
    finally:
        stop()
    assert len(traces) == replay.ROLLOUTS and {t["task"]["data"]["id"] for t in traces} == {replay.ROW.id}
    assert all(t["ok"] and t["metrics"]["harness_error"] == 0.0 for t in traces), [t["info"] for t in traces]
    replay.check_rollouts([([n["message"] for n in t["nodes"]], t["info"]["verdict"], score(t), t["info"]["scoring_error"])
                           for t in traces])


@pytest.mark.parametrize("level", [1, 2, 3])
def test_vf_eval_scores_every_finding_in_the_trial_as_the_models_failure(tmp_path, level):
    """tests/test_total_trial.py's vf-eval run on this line: each of issue 34's findings, 0.0 as the
    model's failure with its reason, never a harness fault."""
    from tests.test_total_trial import reason, trial_rows

    count = trial_rows(tmp_path / "rows.jsonl", level)
    positions = {json.loads(line)["info"]["task_id"]: i for i, line in enumerate((tmp_path / "rows.jsonl").read_text().splitlines())}
    url, stop = policy_server.serve_in_thread(tmp_path / "rows.jsonl")
    args = ("--env.taskset.tiers", "intermediate", "--env.taskset.kind", "function", "--env.taskset.level", str(level),
            "--env.taskset.num-train-examples", str(count), "-c", str(count))
    try:
        traces = run_vf_eval(url, "trial_hostile", tmp_path / "out", count, args)
    finally:
        stop()
    plays = hostile_functions.TRIAL_PLAYS
    played = {plays[positions[t["task"]["data"]["id"]] % len(plays)]: t for t in traces}
    assert set(played) == set(plays), sorted(played)
    for name, trace in played.items():
        where = (name, trace["info"].get("verdict"), trace["info"].get("scoring_error"))
        assert trace["ok"] and score(trace) == 0.0 and trace["metrics"]["harness_error"] == 0.0, where
        assert reason(name, level) in trace["info"]["verdict"]["reason"], where
