"""Run as trainers run it (issue 36): a host holding more than 1,024 file descriptors, hidden cases
drawn off the event loop for each rollout alone, and one secret per evaluation shared by
verifiers' env-server workers and kept from every sandbox."""

import asyncio
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ptenv.env import rollout
from ptenv.host.local import LocalSandboxClient
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.rows import parse_row
from ptenv.tasks.tiers import find_family, select
from tests.support import proctree
from tests.support.policy_server import serve_in_thread
from tests.support.sandbox import new_box, wait_until
from tests.support.vf_eval import eval_command, leftover_sandboxes

ROOT = Path(__file__).resolve().parents[1]
HELD_FDS = 1100  # past select()'s ceiling of 1,023
FUNCTION_ROWS = 8
FUNCTION_ARGS = ["-a", json.dumps({"kind": "function", "num_train_examples": FUNCTION_ROWS})]


@pytest.fixture(scope="module")
def function_server(tmp_path_factory):
    """The scripted policy server, knowing the first basic function rows (the reference policy answers them)."""
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(i.row()) + "\n" for i in select(["basic"], "train", FUNCTION_ROWS, 0, "function")))
    url, stop = serve_in_thread(path)
    yield url
    stop()


def vf_eval(url: str, args: list[str], out: Path, env: dict | None = None, watch=None) -> list[dict]:
    """The real classic vf-eval; its results, after checking that nothing of it outlived it.
    `watch` is called every 0.2 s while it runs."""
    command, run_env = eval_command(url, "reference", args, out)
    proc = subprocess.Popen(command, env={**run_env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    output = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        if watch:
            watch()
        time.sleep(0.2)
    reader.join()
    assert proc.returncode == 0, output[0][-3000:]
    assert wait_until(lambda: not leftover_sandboxes(), 10), leftover_sandboxes()
    (results,) = out.glob("evals/*/*/results.jsonl")
    return [json.loads(line) for line in results.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rollouts_pass_through_vf_eval_in_a_host_holding_1100_fds(server, function_server, tmp_path):
    # Every process of the run (vf-eval, its env server's worker) holds 1,100 fds before it
    # loads the environment: each sandbox's channel is numbered past select()'s 1,023.
    env = {"PTENV_HOLD_FDS": str(HELD_FDS), "PYTHONPATH": str(ROOT / "tests" / "support" / "many_fds")}
    rows = vf_eval(server, ["-n", "6", "-r", "1", "-c", "3"], tmp_path / "result", env)
    rows += vf_eval(function_server, ["-n", "4", "-r", "1", "-c", "2", *FUNCTION_ARGS], tmp_path / "fn", env)
    assert [(r["reward"], r["scoring_error"]) for r in rows] == [(1.0, None)] * 10


def test_the_host_raises_its_open_file_limit_to_the_hard_limit():
    code = ("import resource; from ptenv.host import transports; transports.create('local'); "
            "print(*resource.getrlimit(resource.RLIMIT_NOFILE))")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    assert done.stdout.split() == [str(hard), str(hard)]


async def test_hidden_cases_are_drawn_in_the_drawing_process_while_the_loop_runs(monkeypatch):
    family = find_family("autograd/layer_norm_backward_fn")[1]  # a slow draw: every listed implementation, twice
    row = family.instance("train", 3).row()

    def not_here(*args):
        raise AssertionError("drawn in the host's process, whose GIL the event loop needs")

    monkeypatch.setattr(HiddenCases, "of", not_here)
    ticks = []

    async def heartbeat():
        while True:
            await asyncio.sleep(0.005)
            ticks.append(time.monotonic())

    beat = asyncio.create_task(heartbeat())
    task = parse_row(row, "test row")
    draws = [rollout.start_draw(task, HiddenCases("off-loop", 8)) for _ in range(4)]
    cases = [await draw.cases for draw in draws]
    beat.cancel()
    assert b"ptenv.env.drawer" in Path(f"/proc/{rollout.DRAWER.pid}/cmdline").read_bytes()
    assert len(ticks) >= 4  # the loop ran while the draws did
    # Four rollouts of one prompt: four sets of cases (the same classes, fresh inputs).
    assert [name for name, _, _ in cases[0]] == [name for name, _, _ in cases[1]]
    assert len({str(c[0][1]) for c in cases}) == 4
    assert len({draw.nonce for draw in draws}) == 4


@pytest.mark.slow
@pytest.mark.rootless
async def test_the_evaluation_secret_never_reaches_a_sandbox():
    secret = rollout.evaluation_secret()
    client = LocalSandboxClient()  # its fork server starts now, after the secret was made
    try:
        box = await new_box(client)
        shown = await box.sh("cat /proc/[0-9]*/environ; env")
        cell = await box.cell("import os\nprint(dict(os.environ))")
        assert shown.exit_code == 0 and "PATH=" in shown.stdout and cell.status == "ok"
        assert secret not in shown.stdout + cell.stdout
    finally:
        client.teardown()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_env_server_workers_draw_from_one_secret(function_server, tmp_path):
    forkservers: dict[int, int] = {}  # bwrap of a fork server -> the worker that started it

    def watch():
        forkservers.update(proctree.forkserver_bwraps(os.getpid()))

    args = ["-n", "4", "-r", "6", "-c", "12", "--num-workers", "2", *FUNCTION_ARGS]
    rows = vf_eval(function_server, args, tmp_path / "out", watch=watch)
    workers = {parent for parent in forkservers.values() if parent not in forkservers}  # bwrap forks itself
    assert len(workers) == 2  # both workers made sandboxes
    assert [(r["reward"], r["scoring_error"]) for r in rows] == [(1.0, None)] * 24
    assert len({r["info"]["hidden_secret_id"] for r in rows}) == 1
    assert len({r["info"]["hidden_nonce"] for r in rows}) == 24  # each rollout drew its own


OUT_OF_FDS = """
import asyncio, resource
from prime_sandboxes import CreateSandboxRequest
from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import Limits

resource.setrlimit(resource.RLIMIT_NOFILE, (60, 60))  # a sandbox's own limit must fit under it: Limits below


async def main():
    client, request, made = LocalSandboxClient(Limits(open_files=32)), CreateSandboxRequest(name="fds", docker_image="local"), []
    try:
        while True:
            try:
                made.append((await client.create(request)).id)
            except Exception as e:
                print(f"failed: {type(e).__name__}: {e}")
                break
        for sandbox_id in made[:6]:
            await client.delete(sandbox_id)
        again = await client.create(request)
        print("again:", (await client.execute_command(again.id, "echo ok")).stdout.strip())
        print("still:", (await client.execute_command(made[-1], "echo ok")).stdout.strip())
    finally:
        client.teardown()


asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_host_out_of_fds_fails_a_create_in_one_line_and_the_rest_go_on():
    done = subprocess.run([sys.executable, "-c", OUT_OF_FDS], cwd=ROOT, capture_output=True, text=True, timeout=280)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 3, done.stdout + done.stderr[-2000:]
    assert lines[0].startswith("failed: SandboxUnavailableError: the host process is out of file descriptors (its "
                               "limit is 60)"), lines
    assert lines[1:] == ["again: ok", "still: ok"]
