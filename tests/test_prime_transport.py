"""The Prime transport, tested at the SDK boundary (the service cannot be reached from here): the
environment's real rollouts against tests/support/fake_prime.py, which records every call and payload and
runs the request's start command and each command for real in a container-like bwrap."""

import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import verifiers as vf
from prime_sandboxes import CreateSandboxRequest, StartCommand

import pytorch_env
from tests.support.fake_prime import FakePrimeService
from ptenv import inside
from ptenv.host import prime, transports
from ptenv.host.assess import assess_function
from ptenv.host.requests import preload, run_cell
from ptenv.inside import supervisor
from ptenv.inside.protocol import Limits
from ptenv.tasks.fn_expert import LAYER_NORM_BACKWARD
from ptenv.tasks.fn_intermediate import SEGMENT_MEAN
from ptenv.tasks.functions import HiddenCases

pytestmark = pytest.mark.slow  # every rollout runs in a container-like bwrap

ROOT = Path(__file__).resolve().parents[1]
TASK = "tensor_ops/transpose_dims"


@pytest.fixture
def service(monkeypatch):
    service = FakePrimeService()
    monkeypatch.setattr("verifiers.legacy.utils.threaded_sandbox_client.AsyncSandboxClient", service.client_class())
    monkeypatch.setattr(prime, "READY_POLL", 0.2)
    monkeypatch.setenv("POLICY_KEY", "unused")
    yield service
    service.close()


# vf.State quoted: the v1 run (verifiers 0.4 has no vf.State) collects this module too.
def rollout(url: str, policy: str) -> "vf.State":
    env = pytorch_env.load_environment(sandbox="prime")
    row = next(r for r in env.get_dataset() if TASK in r["info"])
    client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="POLICY_KEY", api_base_url=url)

    async def play():
        state = await env.rollout({**row, "answer": ""}, client, policy)
        await env.rubric.score_rollout(state)
        return state

    return asyncio.run(play())


def unpack(archive: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(archive))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_a_rollout_sends_the_expected_calls_and_scores_in_the_container(service, server):
    state = rollout(server, "reference")
    assert state["reward"] == 1.0, state["verdict"]
    assert state["scoring_error"] is None

    steps = service.steps()
    polls = [s for s in steps if s == f"sh: {prime.READY_COMMAND}"]
    assert steps == ["create", "wait_for_creation", *polls, "preload", "run_cell", "read_result", "delete"], steps
    assert polls, "setup waits for the supervisor"

    request: CreateSandboxRequest = service.calls[0][1]
    assert request.docker_image == "python:3.11-slim"
    assert request.start_command == StartCommand(executable="sh", args=["-c", prime.START_SCRIPT])
    assert set(request.environment_vars) == {"PTENV_INSIDE", "PTENV_TORCH", "PTENV_LIMITS"}
    assert request.environment_vars["PTENV_TORCH"] == prime.torch_version() == "2.13.0"
    assert json.loads(request.environment_vars["PTENV_LIMITS"]) == transports.LIMITS.as_dict()
    shipped = unpack(request.environment_vars["PTENV_INSIDE"])
    assert sorted(shipped) == sorted(inside.FILES)
    assert all(shipped[rel] == (ROOT / rel).read_bytes() for rel in shipped)
    assert "tasks.py" not in " ".join(shipped) and "train.jsonl" not in " ".join(shipped)
    # The container installs the CPU wheel of the host's torch, so the references reproduce there.
    assert service.pip_calls == ["install --no-cache-dir --quiet --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"]

    sandbox_id = service.calls[1][1]  # the one wait_for_creation was asked about
    commands = [c for c in service.calls if c[0] == "execute_command"]
    assert all(c[1] == sandbox_id for c in commands)
    # Each harness request is `ptenv-request <op> <base64 JSON fields>`, run by Prime as root.
    requests = [(c[2].split()[1], json.loads(base64.b64decode(c[2].split()[2]))) for c in commands
                if c[2].startswith("ptenv-request ")]
    assert [op for op, _ in requests] == ["preload", "run_cell", "read_result"]
    assert set(requests[0][1]) == {"inputs", "timeout"} and set(json.loads(requests[0][1]["inputs"])) == {"x"}
    assert requests[1][1]["code"].startswith("result = ") and requests[1][1]["timeout"] == 45
    assert requests[2][1] == {"timeout": 30}
    assert not service.containers, "the sandbox was deleted"


def test_the_container_enforces_the_limits_the_host_reads_its_replies_by(service):
    """More output than the default: the container's supervisor keeps it, and the host takes it whole."""
    limits = Limits(cell_timeout=10, output_bytes=64 * 1024)
    transport = transports.prime(limits)

    async def play():
        sandbox = await transport.client.create(transport.request)
        try:
            await transport.client.wait_for_creation(sandbox.id)
            await transport.wait_ready(sandbox.id)
            await preload(transport.call, sandbox.id, {}, timeout=transport.command_timeout, limits=limits)
            return await run_cell(transport.call, sandbox.id, "print('x' * 40 * 1024)", timeout=30, limits=limits)
        finally:
            await transport.client.delete(sandbox.id)

    assert asyncio.run(play()) == "x" * 40 * 1024
    request: CreateSandboxRequest = service.calls[0][1]
    assert json.loads(request.environment_vars["PTENV_LIMITS"]) == limits.as_dict()


def test_the_null_policy_scores_zero_without_a_scoring_error(service, server):
    state = rollout(server, "null")
    assert state["reward"] == 0.0 and state["scoring_error"] is None
    assert service.steps()[-2:] == ["read_result", "delete"]


@pytest.mark.parametrize("step", ["create", "wait_for_creation", "preload", "run_cell", "read_result"])
def test_a_failure_at_each_step_scores_zero_with_a_scoring_error_and_deletes_the_sandbox(service, server, step):
    service.fail[step] = RuntimeError(f"injected failure at {step}")
    state = rollout(server, "reference")
    assert state["reward"] == 0.0
    assert f"injected failure at {step}" in state["scoring_error"], state["scoring_error"]
    created = "create" in service.steps() and step != "create"
    assert ("delete" in service.steps()) == created
    assert not service.containers


def test_a_container_whose_torch_install_fails_ends_the_same_way(service, server):
    service.pip_exit_code = 1
    state = rollout(server, "reference")
    assert state["reward"] == 0.0
    assert "not running" in state["scoring_error"], state["scoring_error"]
    assert service.steps()[-1] == "delete" and not service.containers


def test_the_client_reports_a_missing_supervisor_or_a_bad_request_in_one_line(tmp_path):
    env = {**os.environ, "PTENV_SOCKET": str(tmp_path / "nothing.sock"), "PYTHONPATH": str(ROOT)}
    for args, code, message in ((["read_result", "e30="], 111, "supervisor is not running"),
                                (["read_result"], 2, "usage: ptenv-request"),
                                (["run_cell", "not base64!"], 2, "ptenv-request: "),
                                (["sh", "e30="], 2, "usage: ptenv-request")):
        done = subprocess.run([sys.executable, "-m", "ptenv.inside.prime_cli", *args], env=env, capture_output=True,
                              text=True)
        assert done.returncode == code, args
        assert done.stderr.strip().count("\n") == 0 and message in done.stderr, args


SERVER = "$(pgrep -u 0 -f 'ptenv.inside.main serve')"  # root's: the session is a fork of it
ATTACKS = {  # what the model's bash tries on the supervisor, which runs as the container's root
    f"kill -INT {SERVER}": "Operation not permitted",
    f"renice -n 19 -p {SERVER}": "Operation not permitted",
    f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{prime.SUPERVISOR_SOCKET}')\"": "PermissionError",
}


def test_in_the_container_the_model_runs_as_its_own_uid_and_cannot_touch_the_session_server(service):
    env = pytorch_env.load_environment(sandbox="prime")
    row = next(r for r in env.get_dataset() if TASK in r["info"])

    async def play():
        state = await env.setup_state({"prompt": [], "completion": [], "info": json.loads(row["info"]),
                                       "answer": "", "task": "default"})
        sandbox = (state["sandbox_id"], state["sandbox_state"])
        try:
            replies = {command: await env.bash(command, *sandbox) for command in ["id -u", *ATTACKS]}
            cell = await env.execute_code("import os\nprint(os.getuid())", *sandbox)
            return replies, cell
        finally:
            await env.destroy_sandbox(state)

    replies, cell = asyncio.run(play())
    assert replies["id -u"] == cell == str(supervisor.CONTAINER_MODEL_UID)
    for command, refusal in ATTACKS.items():
        assert refusal in replies[command], (command, replies[command])
    # Prime ran each of the model's commands as `ptenv-request shell`, never as a bare shell command.
    shells = [json.loads(base64.b64decode(c[2].split()[2])) for c in service.calls
              if c[0] == "execute_command" and c[2].startswith("ptenv-request shell ")]
    assert shells == [{"command": c, "cwd": None, "timeout": env.timeout_per_command_seconds} for c in ["id -u", *ATTACKS]]
    assert not [c for c in service.steps() if c.startswith("sh: ") and c != f"sh: {prime.READY_COMMAND}"]


def test_a_function_tasks_trial_runs_in_the_container_through_ptenv_request(service):
    """The `trial` request is one more `ptenv-request` command: the container's supervisor forks a
    caller with new processes refused, and the host grades the outputs (the reference passes, a
    forking answer fails that case as the model's, never as a harness fault); at a backward
    family's hardest level the allowlist goes with the request and holds there too."""
    transport = transports.prime(Limits(cell_timeout=10))
    family = SEGMENT_MEAN
    cases = HiddenCases("prime", 4).of(family, 1)
    forking = "import os\ndef segment_mean(x, seg, num_segments):\n    os.fork()\n    return x\n"
    backward = LAYER_NORM_BACKWARD
    backward_cases = HiddenCases("prime", 2).of(backward, 1)
    by_autograd = backward.also_correct["autograd_over_layer_norm"]

    async def play():
        sandbox = await transport.client.create(transport.request)
        try:
            await transport.client.wait_for_creation(sandbox.id)
            await transport.wait_ready(sandbox.id)
            outcomes = [await assess_function(transport.call, sandbox.id, source=source, name=family.name,
                                              inputs=family.instance("t", 1).inputs(), cases=cases, allowlist=None,
                                              limits=transport.limits, partial_credit=False)
                        for source in (family.reference, forking)]
            outcomes.append(await assess_function(transport.call, sandbox.id, source=by_autograd, name=backward.name,
                                                  inputs=backward.instance("t", 1).inputs(), cases=backward_cases,
                                                  allowlist=backward.allowlist(2), limits=transport.limits,
                                                  partial_credit=False))
            return outcomes, sandbox.id
        finally:
            await transport.client.delete(sandbox.id)

    (right, wrong, banned), sandbox_id = asyncio.run(play())
    assert (right.verdict.score, right.scoring_error, right.verdict.reason) == (1.0, None, "all 4 hidden cases pass")
    assert (wrong.verdict.score, wrong.scoring_error, wrong.verdict.outcome) == (0.0, None, "error")
    assert "PermissionError" in wrong.verdict.reason
    commands = [c[2] for c in service.calls if c[0] == "execute_command" and c[1] == sandbox_id]
    hidden = [json.loads(base64.b64decode(c.split()[2])) for c in commands if c.startswith("ptenv-request trial ")]
    assert (banned.verdict.score, banned.scoring_error) == (0.0, None)
    assert "not on the allowlist: the function used automatic differentiation" in banned.verdict.reason
    assert [h["source"] for h in hidden] == [family.reference, forking, by_autograd]
    assert all(set(h) == {"source", "name", "inputs", "cases", "call_limit", "allowlist", "trace", "timeout"} for h in hidden)
    assert [json.loads(h["allowlist"]) for h in hidden] == [None, None, backward.allowlist(2)]
    assert not backward.allowlist(2)["autograd"]
    sent = json.loads(hidden[0]["cases"])
    assert len(sent) == 4 and all(set(case) == set(family.params) for case in sent)
    assert "expected" not in hidden[0]["cases"]  # the arguments only: reference outputs stay on the host


ORACLE = """
import os, socket, torch
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # in a session of its own, out of the interpreter's process group
        server = socket.socket(socket.AF_UNIX)
        server.bind("\\0ptenv-oracle")
        server.listen()
        while True:
            conn, _ = server.accept()
            x = torch.frombuffer(bytearray(conn.recv(1 << 20)), dtype=torch.float32)
            conn.sendall(x.cumsum(0).numpy().tobytes())
    os._exit(0)
print("left running")
"""
ASK_THE_ORACLE = """
import socket
def {name}(**kwargs):
    conn = socket.socket(socket.AF_UNIX)
    conn.connect("\\0ptenv-oracle")
    return torch.zeros(1)
"""


def test_nothing_the_model_left_running_in_its_container_reaches_its_trial(service):
    """Issue 35: a process the model leaves running in its session (in a session of its own, out of
    the interpreter's process group) would serve the caller what the allowlist removes. The session
    ends before the trial (env/rollout.py), killing every process of the model's uid, so the caller
    finds no one to ask."""
    from ptenv.env.rollout import assess_rollout, start_draw
    from ptenv.tasks.rows import parse_row

    transport = transports.prime(Limits(cell_timeout=10))
    row = parse_row(SEGMENT_MEAN.instance("intermediate", 1, 2).row(), "prime row")

    async def play():
        sandbox = await transport.client.create(transport.request)
        try:
            await transport.client.wait_for_creation(sandbox.id)
            await transport.wait_ready(sandbox.id)
            left = await run_cell(transport.call, sandbox.id, ORACLE, timeout=30, limits=transport.limits)
            source = ASK_THE_ORACLE.replace("{name}", SEGMENT_MEAN.name)
            outcome = await assess_rollout(row, transport, sandbox.id, final_message=f"```python\n{source}```",
                                           draw=start_draw(row, HiddenCases("prime", 4)), partial_credit=False)
            survivors = await transport.client.execute_command(
                sandbox.id, "PYTHONPATH=/opt/ptenv python3 -c 'from ptenv.inside.processes import pids_of; "
                            f"print(len(pids_of({supervisor.CONTAINER_MODEL_UID})))'")
            return left, outcome, survivors.stdout.strip()
        finally:
            await transport.client.delete(sandbox.id)

    left, outcome, survivors = asyncio.run(play())
    assert left == "left running"
    assert outcome.scoring_error is None and outcome.verdict.score == 0.0
    assert "ConnectionRefusedError" in outcome.verdict.reason, outcome.verdict.reason
    assert survivors == "0"
