"""Issue 36 on verifiers 0.4: a host holding more than 1,024 file descriptors runs rollouts through
the real vf-eval, and the workers of verifiers' env server draw hidden cases from the one secret of
the process that loaded the taskset (as a trainer's orchestrator does), each rollout its own set."""

import asyncio
import json
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from ptenv.env import rollout
from ptenv.env.v1 import PyTorchTaskset, PyTorchTasksetConfig
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, HiddenCases
from ptenv.tasks.tiers import select
from tests.support import policy_server, proctree
from tests.test_v1_env import run_vf_eval, score

pytestmark = [pytest.mark.v1, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ROWS = 4


@pytest.fixture(scope="module")
def function_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps(i.row()) + "\n" for i in select(["basic"], "train", ROWS, 0, "function")))
    url, stop = policy_server.serve_in_thread(path)
    yield url
    stop()


@pytest.mark.timeout(600)
def test_vf_eval_in_a_host_holding_1100_fds(function_url, tmp_path, monkeypatch):
    monkeypatch.setenv("PTENV_HOLD_FDS", "1100")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "support" / "many_fds"))
    url, stop = policy_server.serve_in_thread()
    try:
        traces = run_vf_eval(url, "reference", tmp_path / "result", 4)
    finally:
        stop()
    traces += run_vf_eval(function_url, "reference", tmp_path / "function", ROWS,
                          ("--env.taskset.kind", "function", "--env.taskset.num-train-examples", str(ROWS)))
    assert [(score(t), t["info"]["scoring_error"]) for t in traces] == [(1.0, None)] * (4 + ROWS)


def serve(address_queue) -> None:
    from verifiers.v1.serve.pool import serve_env
    from verifiers.v1.utils.loaders import resolve_env_config

    config = resolve_env_config({"taskset": {"id": "pytorch-env", "kind": "function", "num_train_examples": ROWS}})
    serve_env(max_workers=2, elastic=False, address="tcp://127.0.0.1:0", address_queue=address_queue, config=config)


@pytest.mark.timeout(600)
async def test_env_server_workers_draw_from_the_loading_process_secret(function_url, monkeypatch):
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.serve.client import EnvClient
    from verifiers.v1.types import SamplingConfig

    monkeypatch.delenv(rollout.SECRET_VARIABLE, raising=False)
    monkeypatch.setenv("SCALE_API_KEY", "unused")
    # As a trainer's orchestrator: load the taskset (the secret is made here), then start the server.
    tasks = list(PyTorchTaskset(PyTorchTasksetConfig(kind="function", num_train_examples=ROWS)))
    secret_id = HiddenCases(os.environ[rollout.SECRET_VARIABLE], DEFAULT_HIDDEN_CASES).secret_id
    context = multiprocessing.get_context("spawn")
    addresses = context.Queue()
    server = context.Process(target=serve, args=(addresses,))
    server.start()
    forkservers: dict[int, int] = {}
    watching = threading.Event()

    def watch():
        while not watching.wait(0.2):
            forkservers.update(proctree.forkserver_bwraps(server.pid))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    client = EnvClient(await asyncio.to_thread(addresses.get, True, 120))
    try:
        await client.wait_for_server_startup()
        model = EvalClientConfig(base_url=function_url, api_key_var="SCALE_API_KEY")
        runs = [client.run(model, "reference", SamplingConfig(), task.data.model_dump()) for task in tasks * 4]
        episodes = await asyncio.gather(*runs)
    finally:
        watching.set()
        await client.close()
        server.terminate()
        server.join(30)
    traces = [t for e in episodes for t in e.traces]
    workers = {parent for parent in forkservers.values() if parent not in forkservers}
    assert len(workers) == 2  # both workers made sandboxes
    assert [(t.reward, t.info["scoring_error"]) for t in traces] == [(1.0, None)] * (ROWS * 4)
    assert {t.info["hidden_secret_id"] for t in traces} == {secret_id}
    assert len({t.info["hidden_nonce"] for t in traces}) == ROWS * 4
