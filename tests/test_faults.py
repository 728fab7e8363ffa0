"""Faults injected into the real environment: a sandbox killed mid-rollout, the host eval
interrupted or killed, a corrupted read-back, a sandbox that cannot be created.

Outcomes: whatever the harness cannot vouch for (a dead sandbox, a failed read-back command, a
sandbox that cannot start) is 0.0 with a one-line scoring_error; a read-back reply that does not
parse is an invalid answer (0.0, reason given, no scoring_error), because the session that writes
it runs the model's code and a model can forge it (tests/test_hostile.py does).
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import uuid

import pytest
import verifiers as vf
from prime_sandboxes import CommandTimeoutError

import pytorch_env
from tests.support import proctree
from tests.support.policy_server import POLICIES, reference_policy
from tests.support.sandbox import wait_until
from tests.support.vf_eval import eval_command, leftover_sandboxes

pytestmark = [pytest.mark.slow, pytest.mark.rootless]


def slow_policy(canary: str, task_ids=None):
    """The reference policy, except that the chosen tasks' cell first marks its sandbox's /tmp
    with `canary` and then sleeps: a rollout caught in the middle."""
    code = f"open('/tmp/{canary}', 'w').close()\nimport time\ntime.sleep(120)\n"

    def policy(row, messages, tools):
        if row is not None and (task_ids is None or row["info"]["task_id"] in task_ids):
            row = {**row, "info": {**row["info"], "reference_solution": code}}
        return reference_policy(row, messages, tools)

    return policy


@pytest.fixture(scope="module")
def env():
    env = pytorch_env.load_environment()
    yield env
    env.sandbox_client.teardown()


async def evaluate(env, url: str, model: str, n: int) -> list[dict]:
    os.environ.setdefault("FAULTS_API_KEY", "unused")
    client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="FAULTS_API_KEY", api_base_url=url)
    out = await env.evaluate(client=client, model=model, num_examples=n, max_concurrent=n,
                             state_columns=["scoring_error", "verdict"], on_progress=lambda *a: None)
    return out["outputs"]


# ---- a sandbox killed in the middle of a rollout


def kill_the_sandbox_holding(canary: str) -> int:
    """SIGKILL, from the host, the supervisor of the sandbox whose /tmp holds `canary`."""
    assert wait_until(lambda: proctree.holding(canary), 60), "the victim's cell never ran"
    supervisor = proctree.supervisor(proctree.holding(canary)[0])
    os.kill(supervisor, signal.SIGKILL)
    return supervisor


async def test_a_sandbox_killed_mid_rollout_fails_that_rollout_only(env, server, monkeypatch):
    canary = f"ptenv-victim-{uuid.uuid4().hex}"
    victim = json.loads(env.get_dataset()[2]["info"])
    monkeypatch.setitem(POLICIES, "victim", slow_policy(canary, {victim["task_id"]}))
    rows, killed = await asyncio.gather(
        evaluate(env, server, "victim", 6), asyncio.to_thread(kill_the_sandbox_holding, canary)
    )
    assert killed and wait_until(lambda: not proctree.holding(canary))  # deleted, and reaped without blocking
    by_task = {r["info"]["task_id"]: r for r in rows}
    hit = by_task.pop(victim["task_id"])
    assert hit["reward"] == 0.0 and hit["harness_error"] == 1.0
    assert "is not running: its supervisor exited" in hit["scoring_error"] and "\n" not in hit["scoring_error"]
    assert len(by_task) == 5
    for task_id, row in by_task.items():
        assert row["reward"] == 1.0 and row["scoring_error"] is None, (task_id, row["scoring_error"])


# ---- the host eval interrupted (Ctrl-C reaches the whole process group) or killed outright


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["SIGINT to its process group", "SIGKILL to vf-eval alone"])
def test_an_interrupted_eval_leaves_no_sandbox_behind(how, server, monkeypatch, tmp_path):
    canary = f"ptenv-interrupted-{uuid.uuid4().hex}"
    monkeypatch.setitem(POLICIES, "sleeper", slow_policy(canary))
    command, environ = eval_command(server, "sleeper", ["-n", "6", "-r", "1", "-c", "6"], tmp_path)
    with open(tmp_path / "vf-eval.log", "w+") as log:
        run = subprocess.Popen(command, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert wait_until(lambda: len(proctree.holding(canary)) >= 2 * 4, 180), "the cells never ran"
            # Everything the run started: vf-eval, its env server, bwrap, the fork server and the sandboxes.
            sandboxes = proctree.holding(canary)
            everything = proctree.tree([run.pid])
            assert set(sandboxes) <= everything.keys()
            if how.startswith("SIGINT"):
                os.killpg(run.pid, signal.SIGINT)
            else:
                run.kill()
            run.wait(timeout=60)

            def gone():
                return not proctree.survivors(everything) and not proctree.holding(canary)

            assert wait_until(gone, 30), f"left running: {proctree.survivors(everything)}"
            assert not leftover_sandboxes()
            log.seek(0)
            sockets = re.findall(r"ipc://(/tmp/vf-[\w-]+)", log.read())  # verifiers' env server's own scratch
            assert sockets and not [s for s in sockets if os.path.exists(s)]
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
            log.seek(0)
            print(log.read()[-3000:])


# ---- the read-back corrupted at the transport boundary


class CorruptingTransport:
    """The real local transport, except that the reply to the `result` request goes through
    `corrupt` (which may also raise, as a failing transport would)."""

    def __init__(self, transport, corrupt):
        self.transport, self.corrupt = transport, corrupt

    def __getattr__(self, name):
        return getattr(self.transport, name)

    async def call(self, sandbox_id, op, fields, timeout):
        reply = await self.transport.call(sandbox_id, op, fields, timeout)
        return self.corrupt(reply) if op == "read_result" else reply


def doc(value):
    return lambda reply: value


def truncated_data(reply):
    """A well-formed document whose tensor payload lost its last bytes."""
    return {**reply, "result": {**reply["result"], "data": reply["result"]["data"][:-8]}}


def timed_out(reply):
    raise CommandTimeoutError("sandbox", "result", 30)


def failed(reply):
    raise RuntimeError("`ptenv-request read_result` exited with 1: ptenv-request: crashed")


INVALID_ANSWERS = {
    "truncated payload": (truncated_data, "result could not be decoded"),
    "a tensor far over the size cap": (
        doc({"status": "ok", "result": {"dtype": "float32", "shape": [1073741824], "data": "AAAAAA=="}}),
        "result could not be decoded"),
    "the wrong document": (doc({"status": "ok", "traceback": ""}), "result reply is malformed"),
    "not a document": (doc(["status", "ok"]), "result reply is malformed"),
}
HARNESS_ERRORS = {
    "a failed request": (failed, "`ptenv-request read_result` exited with 1: ptenv-request: crashed"),
    "a timeout": (timed_out, "reading result back failed: CommandTimeoutError"),
}


async def test_the_same_rollout_read_back_untouched_scores_one(env, server, monkeypatch):
    monkeypatch.setattr(env, "transport", CorruptingTransport(env.transport, lambda reply: reply))
    (row,) = await evaluate(env, server, "reference", 1)
    assert row["reward"] == 1.0 and row["scoring_error"] is None


@pytest.mark.parametrize("fault", INVALID_ANSWERS)
async def test_a_corrupted_read_back_is_an_invalid_answer(env, server, monkeypatch, fault):
    corrupt, reason = INVALID_ANSWERS[fault]
    monkeypatch.setattr(env, "transport", CorruptingTransport(env.transport, corrupt))
    (row,) = await evaluate(env, server, "reference", 1)  # a right answer, until the read-back
    assert row["reward"] == 0.0 and row["scoring_error"] is None
    assert reason in row["verdict"]["reason"] and "\n" not in row["verdict"]["reason"]


@pytest.mark.parametrize("fault", HARNESS_ERRORS)
async def test_a_failed_read_back_is_a_harness_error(env, server, monkeypatch, fault):
    corrupt, reason = HARNESS_ERRORS[fault]
    monkeypatch.setattr(env, "transport", CorruptingTransport(env.transport, corrupt))
    (row,) = await evaluate(env, server, "reference", 1)
    assert row["reward"] == 0.0 and row["harness_error"] == 1.0
    assert reason in row["scoring_error"] and "\n" not in row["scoring_error"]
    assert reason in str(row["error"])  # a rollout error too: trainers that mask errored rollouts leave it out


# ---- sandbox creation failing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bwrap", [None, "echo 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1"],
                         ids=["bwrap missing", "bwrap cannot isolate"])
async def test_a_sandbox_that_cannot_be_created_is_a_clear_error(server, monkeypatch, tmp_path, bwrap):
    if bwrap is None:  # not installed
        monkeypatch.setenv("PATH", str(tmp_path))
        reason = "bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap`"
    else:  # installed, but this machine cannot isolate
        (tmp_path / "bwrap").write_text(f"#!/bin/sh\n{bwrap}\n")
        (tmp_path / "bwrap").chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
        reason = "cannot start the sandbox fork server: bwrap: Creating new namespace failed"
        options = ("--security-opt seccomp=unconfined", "a pod that allows them", 'sandbox="prime"')
    env = pytorch_env.load_environment()
    try:
        start = time.monotonic()
        rows = await evaluate(env, server, "reference", 3)
        elapsed = time.monotonic() - start
    finally:
        env.sandbox_client.teardown()
    assert elapsed < 20
    for row in rows:
        assert row["reward"] == 0.0 and row["harness_error"] == 1.0
        assert reason in row["scoring_error"] and "\n" not in row["scoring_error"]
        assert bwrap is None or all(option in row["scoring_error"] for option in options), row["scoring_error"]
