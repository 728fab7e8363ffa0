"""End-to-end environment benchmark: rollouts per second through Environment.evaluate with the
scripted `reference` policy, for the local transport (fork server) and, in the same run, a naive
transport that starts a fresh interpreter (bwrap + python + import torch) for every sandbox; then
the environment's own cost per rollout with the model's time taken out, phase by phase.

    .venv/bin/python bench/bench_env.py [--quick] [--profile]

The policy server runs in its own process on 127.0.0.1, as a model server would: its CPU is not
the environment's. --profile adds a cProfile of the host process at concurrency 8: who spends its CPU.
"""

import argparse
import asyncio
import contextvars
import cProfile
import dataclasses
import os
import pstats
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import verifiers as vf

import pytorch_env
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from ptenv.host import assess
from tests.support import proctree
from ptenv.host import transports
from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import Limits

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 8, 32)
# Rollouts per (transport, concurrency); a naive sandbox costs a full interpreter start.
ROLLOUTS = {"local": {1: 90, 8: 180, 32: 270}, "naive": {1: 3, 8: 8, 32: 32}}
QUICK = {"local": {1: 45, 8: 90, 32: 96}, "naive": {1: 2, 8: 8, 32: 32}}
PHASES = ("create", "preload", "cell", "read-back", "grading", "delete")


# ---- the naive transport: the same bwrap command and ptenv.inside.main, a fresh interpreter per sandbox


class FreshInterpreter(LocalSandboxClient):
    """A LocalSandboxClient with no pool, used for exactly one sandbox: creating it starts
    bwrap + python + import torch, as a transport without a fork server must."""

    pool_size = 0


class NaiveClient:
    """One FreshInterpreter per sandbox, behind the client interface SandboxEnv uses."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.clients: dict[str, FreshInterpreter] = {}

    async def create(self, request):
        client = FreshInterpreter(self.limits)
        try:
            sandbox = await client.create(request)
        except BaseException:
            await asyncio.to_thread(client.teardown)
            raise
        self.clients[sandbox.id] = client
        return sandbox

    async def wait_for_creation(self, sandbox_id: str) -> None:
        await self.clients[sandbox_id].wait_for_creation(sandbox_id)

    async def execute_command(self, sandbox_id: str, command: str, **kwargs):
        return await self.clients[sandbox_id].execute_command(sandbox_id, command, **kwargs)

    async def call(self, sandbox_id: str, op: str, fields: dict, timeout: float) -> dict:
        return await self.clients[sandbox_id].call(sandbox_id, op, fields, timeout)

    async def delete(self, sandbox_id: str) -> dict:
        client = self.clients.pop(sandbox_id, None)
        if client is not None:
            await asyncio.to_thread(client.teardown)  # the interpreter goes with its sandbox
        return {"success": True, "id": sandbox_id}

    async def bulk_delete(self, sandbox_ids: list[str]) -> None:
        for sandbox_id in sandbox_ids:
            await self.delete(sandbox_id)

    def teardown(self) -> None:
        for client in self.clients.values():
            client.teardown()
        self.clients.clear()


def naive(limits: Limits = transports.LIMITS, allowlist_base: list[str] | None = None) -> transports.Transport:
    """As transports.create builds one. No fork server, so no trial zygote: every trial runs in its
    rollout's own sandbox, as on Prime (`allowlist_base` is for the zygote only)."""
    client = NaiveClient(limits)
    return dataclasses.replace(transports.local(limits), client=client, delete_all=client.bulk_delete, call=client.call,
                               trial_sandbox=transports.in_place)


transports.TRANSPORTS["naive"] = naive  # load_environment(sandbox="naive") builds the same env on it


# ---- where the time goes: the client calls and the grading, per rollout

RECORD: contextvars.ContextVar[dict] = contextvars.ContextVar("record")


class Timed:
    """Wraps the env's sandbox client and its transport's `call` and times each by phase, per
    rollout (a rollout's calls all run in its own asyncio task, so the record started at create
    follows them)."""

    def __init__(self, client):
        self.client = client
        self.records: dict[str, dict] = {}

    def __getattr__(self, name):
        return getattr(self.client, name)

    async def create(self, request):
        start = time.perf_counter()
        sandbox = await self.client.create(request)
        record = self.records[sandbox.id] = defaultdict(float, create=time.perf_counter() - start)
        RECORD.set(record)
        return sandbox

    async def execute_command(self, sandbox_id, command, **kwargs):
        start = time.perf_counter()
        try:
            return await self.client.execute_command(sandbox_id, command, **kwargs)
        finally:
            self.records[sandbox_id]["bash"] += time.perf_counter() - start

    async def call(self, sandbox_id, op, fields, timeout):
        start = time.perf_counter()
        try:
            return await self.client.call(sandbox_id, op, fields, timeout)
        finally:
            self.records[sandbox_id][PHASE_OF_OP[op]] += time.perf_counter() - start

    async def delete(self, sandbox_id):
        start = time.perf_counter()
        try:
            return await self.client.delete(sandbox_id)
        finally:
            self.records[sandbox_id]["delete"] += time.perf_counter() - start


PHASE_OF_OP = {"preload": "preload", "run_cell": "cell", "read_result": "read-back"}


def time_grading() -> None:
    """Time assess.grade (looked up at call time by assess.assess_result) into the current rollout's record."""
    grade = assess.grade

    def timed(answer, expected):
        start = time.perf_counter()
        try:
            return grade(answer, expected)
        finally:
            RECORD.get()["grading"] += time.perf_counter() - start

    assess.grade = timed


# ---- runs


def start_policy_server() -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "tests.support.policy_server", "--port", "0"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    return server, server.stdout.readline().strip()


async def run(env, url: str, n: int, concurrency: int) -> tuple[float, list[dict]]:
    """Rollouts per second over n rollouts (the 45 tasks in turn), and the outputs."""
    rows = env.get_dataset().to_list()
    inputs = [{**rows[i % len(rows)], "example_id": i} for i in range(n)]
    client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="BENCH_API_KEY", api_base_url=url)
    start = time.perf_counter()
    out = await env.generate(inputs, client=client, model="reference", max_concurrent=concurrency,
                             independent_scoring=True, state_columns=["scoring_error", "sandbox_id"],
                             on_progress=lambda *a: None)
    elapsed = time.perf_counter() - start
    outputs = out["outputs"]
    bad = [o["info"]["task_id"] for o in outputs if o["reward"] != 1.0 or o["scoring_error"]]
    if bad:
        sys.exit(f"{len(bad)} of {n} rollouts did not score 1.0: {bad[:5]}")
    return n / elapsed, outputs


def p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def breakdown(outputs: list[dict], records: dict[str, dict]) -> dict[str, float]:
    """p50 per rollout of each phase, of the rest (verifiers' own loop, tool parsing, the rubric) and
    of the total: the rollout's wall time (setup to scored) less the model's time."""
    rows = []
    for o in outputs:
        timing, record = o["timing"], records[o["sandbox_id"]]
        total = timing["total"] - timing["model"]["duration"]
        rows.append({**{p: record[p] for p in PHASES}, "rest": total - sum(record[p] for p in PHASES), "total": total})
    return {key: p50([r[key] for r in rows]) for key in (*PHASES, "rest", "total")}


class CPU:
    """CPU seconds used so far: by this process, the policy server, the fork server with every
    sandbox it has reaped (the sandbox side), and the whole machine (other users included)."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, server_pid: int):
        self.server_pid = server_pid

    def now(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        forkservers = [pid for pid in proctree.tree([os.getpid()]) if b"ptenv.inside.main\0forkserver" in cmdline(pid)]
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
        return {
            "host": usage.ru_utime + usage.ru_stime,
            "server": self.ticks(self.server_pid),
            "sandboxes": sum(self.ticks(pid) for pid in forkservers),
            "machine": (sum(ticks) - ticks[3] - ticks[4]) / self.TICK,  # all but idle and iowait
        }

    def ticks(self, pid: int) -> float:
        """utime + stime + cutime + cstime of a process (its reaped children included)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return sum(int(t) for t in f.read().rsplit(")", 1)[1].split()[11:15]) / self.TICK
        except OSError:
            return 0.0


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


# Entry points whose cumulative CPU says who spends the host process's time in a rollout.
PROFILE_GROUPS = {
    "the model call (verifiers' client: openai, httpx)": [("verifiers/legacy/envs/environment.py", "get_model_response")],
    "the rubric (verifiers: inspect.signature per reward function)": [("verifiers/legacy/rubrics/rubric_group.py", "score_rollout")],
    "this environment (setup, execute_code, post_rollout)": [
        ("ptenv/env/classic.py", "setup_state"), ("ptenv/env/classic.py", "execute_code"),
        ("ptenv/env/classic.py", "post_rollout")],
}


def profile_shares(profile: cProfile.Profile) -> list[tuple[str, float]]:
    """CPU of the host process's main thread inside rollouts, by who spends it."""
    stats = pstats.Stats(profile).stats

    def cumulative(path: str, function: str) -> float:
        return sum(v[3] for (f, _, name), v in stats.items() if f.endswith(path) and name == function)

    total = cumulative("verifiers/legacy/envs/environment.py", "run_rollout")
    shares = [(label, sum(cumulative(*entry) for entry in entries)) for label, entries in PROFILE_GROUPS.items()]
    return shares + [("the rest of verifiers' rollout loop", total - sum(t for _, t in shares))]


async def main(quick: bool, profile: bool) -> None:
    os.environ.setdefault("BENCH_API_KEY", "unused")
    counts = QUICK if quick else ROLLOUTS
    server, url = start_policy_server()
    cpu = CPU(server.pid)
    time_grading()
    rates: dict[str, dict[int, float]] = {}
    try:
        for name in ("local", "naive"):
            env = pytorch_env.load_environment(sandbox=name)
            env.sandbox_client = timed = Timed(env.sandbox_client)
            env.transport = dataclasses.replace(env.transport, call=timed.call)
            await run(env, url, 2, 2)  # warm up: the fork server starts, torch's files are in the page cache
            rates[name] = {}
            for concurrency in CONCURRENCY:
                timed.records.clear()
                before = cpu.now()
                rates[name][concurrency], outputs = await run(env, url, counts[name][concurrency], concurrency)
                used = {k: (v - before[k]) / len(outputs) * 1e3 for k, v in cpu.now().items()}
                phases = breakdown(outputs, timed.records)
                sandboxes = f"{used['sandboxes']:5.1f}" if name == "local" else "    -"  # naive: not measured
                print(f"{name:<5} c={concurrency:<2} {rates[name][concurrency]:7.2f} rollouts/s (n={len(outputs):>3})   "
                      f"env cost p50 {phases['total'] * 1e3:8.1f} ms   CPU ms/rollout: host {used['host']:5.1f}, "
                      f"sandboxes {sandboxes}, policy server {used['server']:4.1f}, machine {used['machine']:6.1f}",
                      flush=True)
                if name == "local" and concurrency == 1:
                    overhead = phases
            if name == "local" and profile:
                profiler = cProfile.Profile(time.thread_time)  # CPU, not time spent waiting in epoll
                profiler.enable()
                await run(env, url, counts[name][8], 8)
                profiler.disable()
                profiled = profile_shares(profiler)
            env.transport.client.teardown()
    finally:
        server.terminate()
        server.wait()

    print("\nrollouts/s (reference policy, Environment.evaluate, independent scoring)")
    print("concurrency   local (fork server)   naive (fresh interpreter)   ratio")
    for c in CONCURRENCY:
        local, base = rates["local"][c], rates["naive"][c]
        print(f"{c:>11}   {local:19.2f}   {base:25.2f}   {local / base:5.0f}x")
    print("\nenvironment cost per rollout, model time taken out (local, concurrency 1, p50 per phase)")
    for key in (*PHASES, "rest"):
        label = "verifiers + glue (rest)" if key == "rest" else key
        print(f"  {label:<24} {overhead[key] * 1e3:6.2f} ms")
    print(f"  {'total':<24} {overhead['total'] * 1e3:6.2f} ms")
    if profile:
        print("\nhost process main thread CPU inside rollouts, concurrency 8 (cProfile, thread time)")
        total = sum(t for _, t in profiled)
        for label, seconds in profiled:
            print(f"  {label:<64} {seconds / total:4.0%}")
    ratio = min(rates["local"][c] / rates["naive"][c] for c in CONCURRENCY)
    print(f"\ntargets: overhead p50 {overhead['total'] * 1e3:.1f} ms (<= 50), "
          f"{rates['local'][8]:.1f} rollouts/s at concurrency 8 (>= 20), "
          f"{ratio:.0f}x the naive transport at worst (>= 30)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts")
    parser.add_argument("--profile", action="store_true", help="cProfile the host process at concurrency 8")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.profile))
