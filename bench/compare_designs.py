"""This checkout's sandbox against another checkout's, side by side in one run.

    git worktree add /tmp/before <commit>            # the design to compare against
    .venv/bin/python bench/compare_designs.py /tmp/before

Each design is measured in its own process (PYTHONPATH points at its checkout), in alternating
rounds so that the machine's noise falls on both alike:
- ready p50: create -> first shell command (`true`) answered, with the pool refilled between
  sandboxes (a shell command is what every design since the first answers alike);
- rollout p50: one whole rollout through Environment.evaluate at concurrency 1 with the scripted
  `reference` policy on 127.0.0.1 (two model calls, preload, one cell, read-back, grading, delete):
  the environment's cost per rollout plus two local HTTP round trips;
- rollouts/s at 8 in flight: 48 rollouts of the same kind through Environment.evaluate.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 3


async def ready_p50(n: int) -> float:
    from prime_sandboxes import CreateSandboxRequest

    try:
        from ptenv.host.local import LocalSandboxClient
    except ImportError:  # a design before the layout by side of the trust boundary (0.2.0)
        from ptenv.sandbox.local import LocalSandboxClient

    client = LocalSandboxClient()
    request = CreateSandboxRequest(name="bench", docker_image="local")
    times = []
    for i in range(n + 1):
        await asyncio.sleep(0.1)  # the pool refills in the background
        start = time.perf_counter()
        sandbox = await client.create(request)
        await client.execute_command(sandbox.id, "true")
        if i:  # the first one starts the fork server
            times.append(time.perf_counter() - start)
        await client.delete(sandbox.id)
    client.teardown()
    return statistics.median(times)


async def rollout_p50(n: int) -> float:
    import verifiers as vf

    import pytorch_env
    try:
        from tests.support.policy_server import serve_in_thread
    except ImportError:  # before 0.2.0
        from ptenv.policy_server import serve_in_thread

    url, stop = serve_in_thread()
    os.environ.setdefault("COMPARE_API_KEY", "unused")
    client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="COMPARE_API_KEY", api_base_url=url)
    env = pytorch_env.load_environment()
    times = []
    try:
        for i in range(n + 1):
            start = time.perf_counter()
            out = await env.evaluate(client=client, model="reference", num_examples=1, max_concurrent=1,
                                     on_progress=lambda *a: None)
            assert out["outputs"][0]["reward"] == 1.0, out["outputs"][0]
            if i:
                times.append(time.perf_counter() - start)
    finally:
        env.sandbox_client.teardown()
        stop()
    return statistics.median(times)


async def rate_at_8(n: int) -> float:
    import verifiers as vf

    import pytorch_env
    from tests.support.policy_server import serve_in_thread

    url, stop = serve_in_thread()
    os.environ.setdefault("COMPARE_API_KEY", "unused")
    client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="COMPARE_API_KEY", api_base_url=url)
    env = pytorch_env.load_environment()
    try:
        await env.evaluate(client=client, model="reference", num_examples=8, max_concurrent=8, on_progress=lambda *a: None)
        start = time.perf_counter()
        out = await env.evaluate(client=client, model="reference", num_examples=n, max_concurrent=8,
                                 on_progress=lambda *a: None)
        elapsed = time.perf_counter() - start
        assert all(o["reward"] == 1.0 for o in out["outputs"]), [o["reward"] for o in out["outputs"]]
    finally:
        env.sandbox_client.teardown()
        stop()
    return n / elapsed


def measure(checkout: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, __file__, "--measure"], cwd=checkout, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(other: Path) -> None:
    runs = {"this": [], "other": []}
    for _ in range(ROUNDS):
        for name, checkout in (("other", other), ("this", REPO)):
            runs[name].append(measure(checkout))
    print(f"this: {REPO}\nother: {other}\n{ROUNDS} alternating rounds, median of the rounds' p50s\n")
    print(f"{'':<14}{'this':>10}{'other':>10}{'this/other':>12}")
    for key in ("ready", "rollout"):
        this = statistics.median(r[key] for r in runs["this"]) * 1e3
        that = statistics.median(r[key] for r in runs["other"]) * 1e3
        print(f"{key + ' p50':<14}{this:8.1f}ms{that:8.1f}ms{this / that:11.2f}x")
    this, that = (statistics.median(r["rate8"] for r in runs[name]) for name in ("this", "other"))
    print(f"{'8 in flight':<14}{this:6.1f}/s  {that:6.1f}/s  {that / this:10.2f}x (time per rollout)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--measure"]:
        print(json.dumps({"ready": asyncio.run(ready_p50(40)), "rollout": asyncio.run(rollout_p50(20)),
                          "rate8": asyncio.run(rate_at_8(48))}))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("other", type=Path, help="a checkout of the design to compare against")
        main(parser.parse_args().other)
