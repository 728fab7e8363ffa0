"""Scale: the real environment with 64, 256 and 1,000 rollouts in flight in one process, as a
trainer keeps them, against a scripted model server on 127.0.0.1 whose replies take a seeded 2-20 s.

    .venv/bin/python bench/bench_scale.py [--concurrency 64 256 1000]       # verifiers 0.3.1
    .venv-v1/bin/python bench/bench_scale.py [--concurrency 64 256]         # verifiers 0.4
    PYTHONPATH=/tmp/before .venv/bin/python bench/bench_scale.py ...        # another checkout's ptenv
    .venv/bin/python bench/bench_scale.py --soak 3600 --concurrency 256 --hostile 0.1
    .venv/bin/python bench/bench_scale.py --smallest                        # the CI setting
    .venv/bin/python bench/bench_scale.py --client openai --concurrency 1000

The model client is the trainer's, not the environment's: by default the one verifiers 0.3.1 builds
from a ClientConfig (httpx 0.29 on httpcore 1.0.9, whose pool walks every connection, and for each
idle one every connection again, on each request: encode/httpcore#1035); with --client openai, the
AsyncOpenAI client openai builds by default (httpx2, whose pool keeps no such walk).

Result and function tasks run side by side, half the concurrency each (two environments in this
process, as a trainer mixing them has); with --hostile, that share of each plays the hostile
policies. The whole batch starts at once. Per concurrency it prints: rollouts/s; environment CPU
per rollout (this process with its drawing process, and the sandboxes: the fork servers with every sandbox, live or reaped;
on verifiers 0.4 also its agent programs, one Python process per rollout); peak host RSS, and PSS
per live sandbox with the batch in flight; this process's open fds; event-loop lag p50/p99
(a 50 ms sleep's overshoot), and where the loop was while it ran more than 50 ms late; create
latency p50/p99; lost rollouts (none came back) and
`scoring_error`s. Before a level it checks that memory and fds can hold it, and says where it stops.
"""

import argparse
import asyncio
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # tests.support is not installed; a PYTHONPATH checkout's ptenv comes first

from ptenv.env import rollout  # noqa: E402
from ptenv.host.local import LocalSandboxClient  # noqa: E402
from ptenv.tasks.tiers import select  # noqa: E402
from tests.support import proctree  # noqa: E402

V1 = not hasattr(__import__("verifiers"), "SandboxEnv")
LEVELS = (64, 256, 1000)
DELAY = (2.0, 20.0)  # seconds per model reply
ROUNDS = 2  # rollouts per slot in a level
FUNCTION_ROWS = 100  # the basic tier's function rows
LAG_TICK = 0.05
LAG_TARGET = 0.05  # issue 36: p99 at most 50 ms
MARGIN_GIB = 3.0  # memory left to the machine's other users
MODEL_CLIENT = "verifiers"  # the model client, from --client
POLICIES = {"result": ("reference", "hostile"), "function": ("reference", "function_hostile")}


# ---- the model server, in its own process


def start_server(delay: tuple[float, float], rows: Path) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "tests.support.policy_server", "--port", "0", "--dataset",
                               str(rows), "--delay", *map(str, delay), "--seed", "36"], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    return server, server.stdout.readline().strip()


def write_rows(path: Path) -> None:
    """The bundled result rows and the basic function rows, for the server to answer by question."""
    function_rows = [i.row() for i in select(["basic"], "train", FUNCTION_ROWS, 0, "function")]
    path.write_text((REPO / "train.jsonl").read_text() + "".join(json.dumps(r) + "\n" for r in function_rows))


# ---- what is measured while a level runs


class Watch:
    """Event-loop lag, create latency, peak RSS, and the sandboxes' PSS and the fds once the batch is in flight."""

    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.lags: list[float] = []
        self.creates: list[float] = []
        self.rss_peak = 0.0
        self.pss: tuple[int, float] | None = None  # (live sandboxes, MiB per sandbox)
        self.fds = 0
        self.done = threading.Event()
        self.tick: float | None = None  # when the current lag tick started
        self.loop_thread = threading.get_ident()
        self.collecting = False
        self.late = Counter()  # where the loop was, sampled while a tick ran more than LAG_TARGET late

    async def lag(self) -> None:
        while True:
            self.tick = time.monotonic()
            await asyncio.sleep(LAG_TICK)
            self.lags.append(time.monotonic() - self.tick - LAG_TICK)

    def blame(self) -> None:
        """A thread: every 10 ms that a tick is overdue by more than LAG_TARGET, note where the loop is."""
        def on_gc(phase, _info):
            self.collecting = phase == "start"
        gc.callbacks.append(on_gc)
        while not self.done.wait(0.01):
            if self.tick is not None and time.monotonic() - self.tick > LAG_TICK + LAG_TARGET:
                self.late[where(sys._current_frames().get(self.loop_thread), self.collecting)] += 1
        gc.callbacks.remove(on_gc)

    def sample(self) -> None:
        """A thread: RSS every second; PSS and fds once, when as many sandboxes live as rollouts are in
        flight or, in a batch that ends rollouts before its last sandboxes exist, once their count falls
        a tenth below its peak."""
        peak = 0
        while not self.done.wait(1.0):
            self.rss_peak = max(self.rss_peak, rss_mib())
            live = live_sandboxes()
            if self.pss is None and (live >= 0.95 * self.concurrency or 0 < live < 0.9 * peak):
                self.fds = len(os.listdir("/proc/self/fd"))
                self.pss = sandbox_pss()
            peak = max(peak, live)


# The innermost frame of these places names where a late loop was; the standard library's frames are skipped.
PLACES = (("/ptenv/", "environment"), ("/httpcore/", "model client"), ("/httpx/", "model client"),
          ("/openai/", "model client"), ("/anyio/", "model client"), ("/verifiers/", "verifiers"))


def where(frame, collecting: bool) -> str:
    """The place; for the environment, also its innermost function (ptenv/host/local.py:call)."""
    if collecting:
        return "garbage collector"
    if frame is not None and frame.f_code.co_filename.endswith("selectors.py") and frame.f_code.co_name == "select":
        return "waiting for a CPU"  # idle in its poll, its timer long due: the machine is busy
    while frame is not None:
        name = frame.f_code.co_filename
        for part, place in PLACES:
            if part in name:
                return place if place != "environment" else f"{place} ({name[name.rindex('/ptenv/') + 1:]}:{frame.f_code.co_name})"
        frame = frame.f_back
    return "other"


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


CLIENTS: list[LocalSandboxClient] = []  # every sandbox client this process made


def time_creates(watch_of) -> None:
    """Time every LocalSandboxClient.create into the current level's Watch; list the clients."""
    create, init = LocalSandboxClient.create, LocalSandboxClient.__init__

    async def timed(self, request):
        start = time.monotonic()
        try:
            return await create(self, request)
        finally:
            watch_of().creates.append(time.monotonic() - start)

    def listed(self, *args, **kwargs):
        init(self, *args, **kwargs)
        CLIENTS.append(self)

    LocalSandboxClient.create, LocalSandboxClient.__init__ = timed, listed


def live_sandboxes() -> int:
    return sum(len(c._boxes) for c in CLIENTS)


def forkserver_trees() -> list[int]:
    """The bwrap processes of this process's fork servers: each the root of its fork server's tree."""
    return [c.pool.forkserver.pid for c in CLIENTS if c.pool.forkserver is not None]


def children_of() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(parent, []).append(int(name))
    return children


def sandbox_pss() -> tuple[int, float]:
    """(live sandboxes, mean PSS in MiB over each one's processes): a sandbox is a child of a fork
    server (bwrap -> bwrap -> fork server -> supervisor) and everything under it."""
    children, total, count = children_of(), 0, 0
    for root in forkserver_trees():
        for forkserver in [p for inner in children.get(root, []) for p in children.get(inner, [])]:
            for supervisor in children.get(forkserver, []):
                count += 1
                total += sum(pss_kib(pid) for pid in proctree.tree([supervisor]))
    return count, total / 1024 / max(count, 1)


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0




def cpu_seconds() -> dict[str, float]:
    """This process with its drawing process, its reaped children (verifiers 0.4's agent programs),
    and every sandbox process with the ones its fork server reaped (utime + stime + cutime + cstime)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    drawing = proctree.cpu(getattr(rollout.DRAWER, "pid", None))  # a checkout with a drawing thread has none
    return {"host": own.ru_utime + own.ru_stime + drawing, "agent programs": reaped.ru_utime + reaped.ru_stime,
            "sandboxes": sum(map(proctree.cpu, proctree.tree(forkserver_trees())))}


def mem_available_gib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 2**20


# ---- one stream of rollouts: an environment, a policy, its share of the concurrency


def streams(concurrency: int, hostile: float) -> list[tuple[str, str, int]]:
    """(kind, policy, concurrency) for each stream: half result, half function tasks."""
    out = []
    for kind in ("result", "function"):
        share = concurrency // 2 if kind == "result" else concurrency - concurrency // 2
        bad = round(share * hostile)
        out += [(kind, POLICIES[kind][0], share - bad)] + ([(kind, POLICIES[kind][1], bad)] if bad else [])
    return out


def expected_reward(policy: str) -> float:
    return 1.0 if policy == "reference" else 0.0


def model_client(url: str):
    """The trainer's model client, as --client chose it."""
    import verifiers as vf

    if MODEL_CLIENT == "openai":
        from openai import AsyncOpenAI

        return vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=url, api_key=os.environ["BENCH_API_KEY"]))
    return vf.ClientConfig(client_type="openai_chat_completions", api_key_var="BENCH_API_KEY", api_base_url=url)


async def run_classic(envs: dict, url: str, kind: str, policy: str, concurrency: int, n: int) -> list[dict]:
    """n rollouts at `concurrency`; one dict per rollout that came back: reward, scoring_error."""
    env = envs[kind]
    rows = env.get_dataset().to_list()
    inputs = [{**rows[i % len(rows)], "example_id": i} for i in range(n)]
    client = model_client(url)
    out = await env.generate(inputs, client=client, model=policy, max_concurrent=concurrency, independent_scoring=True,
                             state_columns=["scoring_error", "verdict"], on_progress=lambda *a: None)
    if MODEL_CLIENT == "openai":
        await client.close()
    return [{"reward": o["reward"], "scoring_error": o["scoring_error"], "reason": (o.get("verdict") or {}).get("reason")}
            for o in out["outputs"]]


async def run_v1(envs: dict, url: str, kind: str, policy: str, concurrency: int, n: int) -> list[dict]:
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    tasks = 45 if kind == "result" else FUNCTION_ROWS
    taskset = {"id": "pytorch-env", "kind": kind} | ({"num_train_examples": FUNCTION_ROWS} if kind == "function" else {})
    config = EvalConfig(env={"taskset": taskset}, model=policy, client={"base_url": url, "api_key_var": "BENCH_API_KEY"},
                        select={"limit": min(n, tasks)}, num_rollouts=math.ceil(n / min(n, tasks)),
                        max_concurrent=concurrency, rich=None, push=False, output_dir=envs["out"],
                        run={"dir": f"{kind}-{policy}-{time.monotonic_ns()}"})
    episodes = await run_eval(config)
    return [{"reward": t.reward if t.ok else None, "scoring_error": t.info.get("scoring_error"),
             "reason": (t.info.get("verdict") or {}).get("reason")} for e in episodes for t in e.traces]


def load_envs(out_dir: str) -> dict:
    if V1:
        return {"out": out_dir}
    import pytorch_env

    return {"result": pytorch_env.load_environment(),
            "function": pytorch_env.load_environment(kind="function", num_train_examples=FUNCTION_ROWS)}


async def level(envs: dict, url: str, concurrency: int, rounds: int, hostile: float) -> dict:
    watch = WATCHES[-1]
    lag = asyncio.create_task(watch.lag())
    sampler = threading.Thread(target=watch.sample, daemon=True)
    blamer = threading.Thread(target=watch.blame, daemon=True)
    sampler.start()
    blamer.start()
    run = run_v1 if V1 else run_classic
    plan = streams(concurrency, hostile)
    before, start = cpu_seconds(), time.monotonic()
    results = await asyncio.gather(*[run(envs, url, kind, policy, c, c * rounds) for kind, policy, c in plan])
    elapsed = time.monotonic() - start
    used = {k: v - before[k] for k, v in cpu_seconds().items()}
    watch.done.set()
    sampler.join()
    blamer.join()
    lag.cancel()
    n = sum(c * rounds for _, _, c in plan)
    rows = [(policy, r) for (_, policy, _), rs in zip(plan, results) for r in rs]
    came_back = sum(r["reward"] is not None or r["scoring_error"] is not None for _, r in rows)
    return {
        "concurrency": concurrency, "rollouts": n, "seconds": elapsed, "rate": n / elapsed,
        "cpu_ms": {k: v / n * 1e3 for k, v in used.items()},
        "rss": watch.rss_peak, "pss": watch.pss, "fds": watch.fds,
        "lag": percentiles(watch.lags), "late": watch.late, "create": percentiles(watch.creates),
        "lost": n - came_back,
        "scoring_errors": sum(r["scoring_error"] is not None for _, r in rows),
        "wrong": sum(r["scoring_error"] is None and r["reward"] is not None and r["reward"] != expected_reward(p)
                     for p, r in rows),
        "why": sorted({f"{p}: {r['scoring_error'] or r['reason']}" for p, r in rows if r["scoring_error"] or (
            r["reward"] is not None and r["reward"] != expected_reward(p))})[:3],
    }


WATCHES: list[Watch] = []


def percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return (math.nan, math.nan)
    ordered = sorted(values)
    return ordered[len(ordered) // 2] * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


def print_level(r: dict) -> None:
    cpu = r["cpu_ms"]
    count, per = r["pss"] or (0, math.nan)
    agent = f" + agent programs {cpu['agent programs']:.0f}" if V1 else ""
    print(f"c={r['concurrency']:<5} {r['rollouts']:>5} rollouts in {r['seconds']:6.1f} s: {r['rate']:6.2f}/s   "
          f"env CPU/rollout {cpu['host'] + cpu['sandboxes']:6.1f} ms (host {cpu['host']:.1f}, sandboxes "
          f"{cpu['sandboxes']:.1f}){agent}", flush=True)
    print(f"        host RSS peak {r['rss']:7.0f} MiB   PSS per live sandbox {per:5.1f} MiB ({count} live)   fds "
          f"{r['fds']}   loop lag p50/p99 {r['lag'][0]:5.1f}/{r['lag'][1]:6.1f} ms   create p50/p99 "
          f"{r['create'][0]:6.1f}/{r['create'][1]:7.1f} ms", flush=True)
    if late := r["late"]:
        places = Counter()
        for place, n in late.items():
            places[place.split(" (")[0]] += n
        shares = ", ".join(f"{place} {n / late.total():.0%}" for place, n in places.most_common())
        ours = ", ".join(f"{place[len('environment ('):-1]} {n}" for place, n in late.most_common() if place.startswith("environment"))
        print(f"        loop >{LAG_TARGET * 1e3:.0f} ms late, sampled every 10 ms ({late.total()}): {shares}", flush=True)
        if ours:
            print(f"        the environment's late samples by function: {ours}", flush=True)
    print(f"        lost {r['lost']}   scoring_error {r['scoring_errors']}   wrong reward {r['wrong']}", flush=True)
    for why in r["why"]:
        print(f"        e.g. {why}", flush=True)


def room_for(concurrency: int, done: list[dict]) -> str | None:
    """Why this machine cannot hold `concurrency` rollouts in flight, or None: memory as measured at
    the last level (host RSS and the sandboxes' PSS, scaled), and this process's fd limit."""
    if done and done[-1]["pss"]:
        last = done[-1]
        per_rollout = (last["pss"][1] * last["pss"][0] + last["rss"]) / last["concurrency"] / 1024
        if V1:
            per_rollout += AGENT_PROGRAM_GIB
        need, have = per_rollout * concurrency, mem_available_gib() - MARGIN_GIB
        if need > have:
            return (f"memory: about {need:.1f} GiB for {concurrency} in flight ({per_rollout * 1024:.0f} MiB per "
                    f"rollout at {last['concurrency']}), {have:.1f} GiB available past a {MARGIN_GIB:g} GiB margin")
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if done and done[-1]["fds"] / done[-1]["concurrency"] * concurrency > limit:
        return f"file descriptors: about {done[-1]['fds'] / done[-1]['concurrency'] * concurrency:.0f} needed, limit {limit}"
    return None


# verifiers 0.4 runs one Python chat program per rollout: a Python with its imports (openai, httpx,
# anyio, mcp) holds 90 MB RSS, 71 MB of it anonymous (measured apart, 2026-12-05).
AGENT_PROGRAM_GIB = 0.08


async def main(levels: list[int], rounds: int, delay: tuple[float, float], hostile: float, soak: float) -> int:
    os.environ.setdefault("BENCH_API_KEY", "unused")
    time_creates(lambda: WATCHES[-1])
    work = tempfile.TemporaryDirectory()
    rows = Path(work.name) / "rows.jsonl"
    write_rows(rows)
    server, url = start_server(delay, rows)
    done: list[dict] = []
    print(f"verifiers {'0.4 (v1)' if V1 else '0.3.1 (classic)'}; model client: {MODEL_CLIENT}; ptenv from {Path(sys.modules['ptenv'].__file__).parent}; "
          f"replies take {delay[0]:g}-{delay[1]:g} s; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        envs = load_envs(work.name)
        WATCHES.append(Watch(4))
        await level(envs, url, 4, 1, 0.0)  # warm up: the fork servers start, torch's files are in the page cache
        for concurrency in levels:
            why = room_for(concurrency, done)
            if why:
                print(f"c={concurrency:<5} stopped here, {why}", flush=True)
                break
            if soak:
                return await soak_run(envs, url, concurrency, hostile, soak)
            WATCHES.append(Watch(concurrency))
            done.append(await level(envs, url, concurrency, rounds, hostile))
            print_level(done[-1])
    finally:
        for client in CLIENTS:
            client.teardown()
        server.terminate()
        server.wait()
        work.cleanup()
    return 0 if all(not (r["lost"] or r["scoring_errors"] or r["wrong"]) for r in done) else 1


async def soak_run(envs: dict, url: str, concurrency: int, hostile: float, seconds: float) -> int:
    """Batches of the level until `seconds` have passed; lost rollouts, memory growth, processes left."""
    start, rss, totals = time.monotonic(), [rss_mib()], {"rollouts": 0, "lost": 0, "scoring_errors": 0, "wrong": 0}
    print(f"soak: {concurrency} in flight for {seconds:g} s, {hostile:.0%} hostile", flush=True)
    while time.monotonic() - start < seconds:
        WATCHES.append(Watch(concurrency))
        result = await level(envs, url, concurrency, ROUNDS, hostile)
        WATCHES[-1] = None  # its samples are not kept: the soak's memory is the environment's
        rss.append(rss_mib())
        for key in totals:
            totals[key] += result[key]
        for why in result["why"]:
            print(f"        e.g. {why}", flush=True)
        print(f"{time.monotonic() - start:7.0f} s: {totals['rollouts']} rollouts, {result['rate']:.2f}/s, lost "
              f"{totals['lost']}, scoring_error {totals['scoring_errors']}, wrong {totals['wrong']}, RSS {rss[-1]:.0f} "
              f"MiB, loop lag p99 {result['lag'][1]:.1f} ms", flush=True)
    for client in CLIENTS:
        client.teardown()
    time.sleep(2)
    left = [p for p in proctree.tree([os.getpid()]) if p not in (os.getpid(), getattr(rollout.DRAWER, "pid", None)) and not is_server(p)]
    print(f"soak: {totals['rollouts']} rollouts in {time.monotonic() - start:.0f} s; lost {totals['lost']}; "
          f"scoring_error {totals['scoring_errors']}; wrong reward {totals['wrong']}; host RSS {rss[0]:.0f} MiB at "
          f"start, {rss[1]:.0f} after the first batch, {rss[-1]:.0f} at the end; processes left {len(left)}", flush=True)
    return 0 if not (totals["lost"] or totals["scoring_errors"] or totals["wrong"] or left) else 1


def is_server(pid: int) -> bool:
    try:
        return b"policy_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rollouts per slot in each level")
    parser.add_argument("--hostile", type=float, default=0.0, help="the share of rollouts playing the hostile policies")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds to run the first level for, in batches")
    parser.add_argument("--client", choices=("verifiers", "openai"), default="verifiers",
                        help="the trainer's model client (verifiers 0.3.1 only): verifiers' from a ClientConfig, "
                             "or openai's default")
    parser.add_argument("--delay", type=float, nargs=2, default=list(DELAY), metavar=("LO", "HI"),
                        help="seconds a model reply takes, drawn between LO and HI")
    parser.add_argument("--smallest", action="store_true", help="8 in flight, replies of 0.1-0.5 s: the CI setting")
    args = parser.parse_args()
    if args.client == "openai" and V1:
        parser.error("--client openai: verifiers 0.4's agent programs build their own client")
    MODEL_CLIENT = args.client
    if args.smallest:
        args.concurrency, args.rounds, args.delay = [8], 1, (0.1, 0.5)
    sys.exit(asyncio.run(main(args.concurrency, args.rounds, tuple(args.delay), args.hostile, args.soak)))
