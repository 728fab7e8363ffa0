"""The pool heals: a fork server killed mid-run, or a sandbox that stalls its own death, costs only
the rollouts in flight; every later rollout gets a working sandbox. A burst of trials' sandboxes is
made as a burst of creates is."""

import asyncio
import os
import signal
import threading

import pytest
import verifiers as vf

import pytorch_env
from ptenv.host import transports
from ptenv.host.assess import assess_function
from ptenv.host.pool import SPAWN_AHEAD
from ptenv.inside.protocol import Limits
from ptenv.tasks import tiers
from ptenv.tasks.fn_intermediate import SEGMENT_MEAN
from ptenv.tasks.functions import HiddenCases
from tests.support import proctree
from tests.support.sandbox import new_box, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.rootless]

CONCURRENCY = 8
TRIALS = SPAWN_AHEAD + 8  # more than the refill forks at once, and than asyncio's default executor has threads
# Threads outlive their cell.
BUSY_THREADS = "import threading\ndef spin():\n    while True:\n        pass\nfor _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\n"


def fork_servers() -> list[int]:
    """This test's fork servers (not those of other runs on the machine): the ptenv.inside.main processes
    whose parent is bwrap, not the trial zygote, supervisors and sessions they fork."""

    def cmdline(pid: int) -> bytes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""

    def is_forkserver(pid: int) -> bool:
        args = cmdline(pid)
        return b"ptenv.inside.main\0forkserver" in args and os.path.basename(args.split(b"\0")[0]) != b"bwrap"

    def is_bwrap(pid: int) -> bool:
        # A supervisor's cmdline reads empty from here, so its interpreter would pass for a fork server.
        return os.path.basename(cmdline(pid).split(b"\0")[0]) == b"bwrap"

    def parent(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return 0

    return [pid for pid in proctree.tree([os.getpid()]) if is_forkserver(pid) and is_bwrap(parent(pid))]


async def evaluate(env, url: str, n: int, rollouts: int) -> list[dict]:
    os.environ.setdefault("POOL_API_KEY", "unused")
    client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="POOL_API_KEY", api_base_url=url)
    out = await env.evaluate(client=client, model="reference", num_examples=n, rollouts_per_example=rollouts,
                             max_concurrent=CONCURRENCY, state_columns=["scoring_error"], on_progress=lambda *a: None)
    return out["outputs"]


@pytest.mark.timeout(300)
async def test_a_fork_server_killed_mid_run_costs_only_the_rollouts_in_flight(server):
    env = pytorch_env.load_environment()
    try:
        run = asyncio.create_task(evaluate(env, server, 45, 4))
        # Once it serves: killed while it starts (imports torch), it fails every create waiting on it.
        assert await asyncio.to_thread(wait_until, lambda: env.sandbox_client._boxes and len(fork_servers()) == 1, 60)
        (first,) = fork_servers()
        await asyncio.sleep(1.0)
        assert not run.done()  # mid-run
        os.kill(first, signal.SIGKILL)
        rows = await run
        assert len(rows) == 180
        failed = [r for r in rows if r["reward"] != 1.0]
        assert all(r["scoring_error"] for r in failed), [r["scoring_error"] for r in failed]
        # In flight: the rollouts holding a sandbox, and the idle ones a create took as it died.
        assert len(failed) <= CONCURRENCY + env.sandbox_client.pool_size, [r["scoring_error"] for r in failed]
        assert fork_servers() != [first]  # it was replaced mid-run
        assert all(r["reward"] == 1.0 for r in await evaluate(env, server, 10, 1))
    finally:
        env.sandbox_client.teardown()


async def test_a_sandbox_that_stalls_its_own_death_does_not_stall_the_pool(client):
    stalling, busy = await new_box(client), await new_box(client)
    # Its processes exit at idle priority while a neighbour keeps every core busy.
    reply = await stalling.cell("import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nhog = bytearray(300 << 20)")
    assert reply.status == "ok", reply
    assert (await busy.cell(BUSY_THREADS)).status == "ok"
    await client.delete(stalling.id)
    for _ in range(6):
        box = await new_box(client)
        assert (await box.cell("print(6 * 7)")).stdout == "42\n"
        await client.delete(box.id)
    await client.delete(busy.id)
    assert wait_until(lambda: not stalling.processes() and not busy.processes(), 30)


@pytest.mark.timeout(180)
async def test_a_fork_server_that_stops_answering_is_replaced(client):
    await new_box(client)  # the fork server runs and the pool is full
    (stopped,) = fork_servers()
    os.kill(stopped, signal.SIGSTOP)
    # The idle sandboxes still answer; past them, creates wait out the control timeout and get a sandbox
    # from a new fork server, and the stopped one is killed.
    boxes = [await new_box(client) for _ in range(client.pool_size + 2)]
    assert fork_servers() not in ([], [stopped])
    assert (await boxes[-1].cell("print(6 * 7)")).stdout == "42\n"
    assert wait_until(lambda: stopped not in fork_servers(), 30)
    # A sandbox it made that a rollout holds ends when that rollout deletes it. (As root its cgroup
    # goes with the fork server; rootless, its supervisor lives on until its channel closes.)
    await client.delete(boxes[0].id)
    assert wait_until(lambda: not boxes[0].processes(), 30)


@pytest.mark.timeout(300)
async def test_a_burst_of_trials_waits_without_a_thread_each_and_each_gets_the_trial_zygotes_sandbox():
    """Level-2 trials' sandboxes come from the refill as creates' do (issue 36 on issue 34's trial
    zygote): a burst of them waits as futures of the event loop, and each gets a fresh sandbox that
    runs its trial under the allowlist."""
    transport = transports.local(Limits(), tiers.allowlist_base())
    client = transport.client
    try:
        await new_box(client)  # both fork servers run; the refill thread is among this process's threads
        threads = threading.active_count()
        burst = asyncio.gather(*(client.create_trial() for _ in range(TRIALS)))
        most = threads
        while not burst.done():
            most = max(most, threading.active_count())
            await asyncio.sleep(0.01)
        trial_ids = await burst
        assert (most, len(set(trial_ids))) == (threads, TRIALS)
        replies = await asyncio.gather(*(client.execute_command(i, "echo ok", timeout=60) for i in trial_ids))
        assert [r.stdout for r in replies] == ["ok\n"] * TRIALS
        outcome = await assess_function(client.call, trial_ids[0], source=SEGMENT_MEAN.by_hand, name=SEGMENT_MEAN.name,
                                        inputs=SEGMENT_MEAN.instance("t", 3, 2).inputs(),
                                        cases=HiddenCases("pool-trials", 4).of(SEGMENT_MEAN, 3),
                                        allowlist=SEGMENT_MEAN.allowlist(2), limits=client.limits, partial_credit=False)
        assert (outcome.verdict.score, outcome.scoring_error) == (1.0, None), outcome.verdict.reason
        for trial_id in trial_ids:
            await client.delete(trial_id)
    finally:
        client.teardown()
