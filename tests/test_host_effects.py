"""No side effects on the host: loading the environment (any tier, either verifiers line) and an
in-process evaluation leave torch's thread count, default dtype and global RNG state, and Python's
`random` state, as they were; and the rows built do not depend on those settings.

Each test first puts the host in a state no task builder would leave it in (3 threads, float64 by
default, seeded RNGs), and puts the defaults back afterwards. Dependencies that touch `random`
when first imported (rich does) are imported before the state is taken: only what the calls do counts.
"""

import contextlib
import os
import random

import pytest
import torch
import verifiers

from ptenv.tasks import tiers
from ptenv.tasks.host_state import reference_run
from ptenv.tasks.rows import dumps_rows

TIERS = list(tiers.TIERS)
CLASSIC = hasattr(verifiers, "SandboxEnv")


def snapshot() -> dict:
    return {"threads": torch.get_num_threads(), "default dtype": torch.get_default_dtype(),
            "torch rng": torch.get_rng_state().tolist(), "python random": random.getstate()}


@contextlib.contextmanager
def unusual_host():
    """A thread count, default dtype and RNG states of the host's own; yields their snapshot."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    try:
        torch.set_num_threads(3)
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(1234)
        random.seed(5678)
        yield snapshot()
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_rng_state(torch_rng)
        random.setstate(python_rng)


def assert_unchanged(before: dict) -> None:
    after = snapshot()
    changed = [key for key in before if after[key] != before[key]]
    assert not changed, f"changed on the host: {changed}"


def test_reference_runs_restore_the_host_and_run_as_a_sandbox_session():
    with unusual_host() as before:
        with reference_run():
            assert (torch.get_num_threads(), torch.get_default_dtype()) == (1, torch.float32)
            with reference_run(torch.float64):  # nested: the float64 recompute inside a build
                assert torch.get_default_dtype() == torch.float64
                torch.manual_seed(0), random.seed(0), torch.rand(3), random.random()
            assert torch.get_default_dtype() == torch.float32
            torch.rand(3)
        assert_unchanged(before)
        with pytest.raises(ZeroDivisionError), reference_run():
            torch.set_num_threads(2)
            1 / 0
        assert_unchanged(before)


def test_rows_do_not_depend_on_the_hosts_torch_settings():
    picks = [(tier, split) for tier in TIERS for split in tiers.SPLITS]
    plain = dumps_rows([i.row() for tier, split in picks for i in tiers.select([tier], split, 2, 0)])
    with unusual_host() as before:
        unusual = dumps_rows([i.row() for tier, split in picks for i in tiers.select([tier], split, 2, 0)])
        assert_unchanged(before)
    assert unusual == plain


@pytest.mark.skipif(not CLASSIC, reason="the classic adapter (verifiers 0.3.1)")
@pytest.mark.parametrize("tier", TIERS)
def test_classic_load_environment_leaves_the_host_as_it_was(tier):
    import pytorch_env

    with unusual_host() as before:
        env = pytorch_env.load_environment(tiers=tier, num_train_examples=2, num_eval_examples=2)
        assert_unchanged(before)
    assert len(env.dataset) == len(env.eval_dataset) == 2


@pytest.mark.skipif(not CLASSIC, reason="the classic adapter (verifiers 0.3.1)")
def test_classic_default_environment_leaves_the_host_as_it_was():
    import pytorch_env

    with unusual_host() as before:
        pytorch_env.load_environment()  # the 45 canonical tasks, from train.jsonl
        pytorch_env.load_environment(tiers=TIERS, num_train_examples=4, split="test")
        assert_unchanged(before)


@pytest.mark.v1
@pytest.mark.parametrize("tier", TIERS)
def test_v1_taskset_leaves_the_host_as_it_was(tier):
    from ptenv.env.v1 import PyTorchTaskset, PyTorchTasksetConfig

    with unusual_host() as before:
        tasks = list(PyTorchTaskset(PyTorchTasksetConfig(tiers=tier, num_train_examples=2)))
        tasks += list(PyTorchTaskset(PyTorchTasksetConfig(tiers=tier, split="test", num_train_examples=2)))
        [task.row() for task in tasks]
        assert_unchanged(before)
    assert len(tasks) == 4


@pytest.mark.slow
@pytest.mark.skipif(not CLASSIC, reason="the classic adapter (verifiers 0.3.1)")
async def test_an_in_process_evaluation_leaves_the_host_as_it_was(server):
    import pytorch_env

    os.environ.setdefault("HOST_EFFECTS_API_KEY", "unused")
    client = verifiers.ClientConfig(client_type="openai_chat_completions", api_key_var="HOST_EFFECTS_API_KEY",
                                    api_base_url=server)
    with unusual_host() as before:
        env = pytorch_env.load_environment()  # canonical tasks: the reference policy knows their solutions
        try:
            out = await env.evaluate(client=client, model="reference", num_examples=2, max_concurrent=2,
                                     on_progress=lambda *a: None)
        finally:
            env.sandbox_client.teardown()
        assert_unchanged(before)
    assert [r["reward"] for r in out["outputs"]] == [1.0, 1.0]


@pytest.mark.v1
@pytest.mark.slow
async def test_an_in_process_v1_rollout_leaves_the_host_as_it_was():
    from tests.test_v1_env import cell, close, new_trace
    from ptenv.env.v1 import PyTorchTaskset, PyTorchTasksetConfig

    with unusual_host() as before:
        (task,) = PyTorchTaskset(PyTorchTasksetConfig(tiers="intermediate", num_train_examples=1))
        trace = new_trace(task)
        await task.setup(trace, None)
        try:
            await cell(trace, task.row().reference_solution)
            await task.finalize(trace, None)
            await task.score(trace, None)
        finally:
            await close(trace)
        assert_unchanged(before)
    assert trace.reward == 1.0
