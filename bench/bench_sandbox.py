"""Local sandbox benchmark: prints, in one run, the fork server against a fresh interpreter per sandbox.

    .venv/bin/python bench/bench_sandbox.py [--quick]
    .venv/bin/python bench/bench_sandbox.py --rootless-as USER [--quick]   # as root: root vs rootless

With --rootless-as, only ready p50, the empty cell p50, PSS per idle sandbox and the CPU share
are measured, as root in this process and then rootless as USER (`scripts/rootless-user` makes ptenv-rootless and
lets it reach the venv), side by side.

- ready: create -> first execute_code answer (an empty cell), p50 / p99; the fork server with its
  pool refilled between sandboxes and back to back (pool drained), and the naive baseline: a fresh
  `python` that imports torch, inside the same bwrap isolation, per sandbox;
- an empty cell's execute_command round trip, p50 / p99;
- PSS per idle sandbox (sum of Pss in /proc/<pid>/smaps_rollup over the sandbox's processes);
- how many of 64 concurrent sandboxes each answer a cell that runs a matmul, and their PSS;
- a first optimiser step in a fresh sandbox (the fork server warmed that path up);
- CPU share: a CPU-bound cell's time alone, and while a neighbouring sandbox runs 8 busy threads;
  and alone against next to 3 sandboxes flooding their stdout.
"""

import argparse
import asyncio
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prime_sandboxes import CreateSandboxRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from tests.support import proctree
from ptenv.host.requests import parse_cell_reply
from ptenv.host.local import LocalSandboxClient
from ptenv.host.view import sandbox_command

REQUEST = CreateSandboxRequest(name="bench", docker_image="local")
WAIT = 60.0  # a request's bound; the sandbox's cell time limit applies first
BASELINE_CODE = (
    "import torch\n"
    "from ptenv.inside.namespace import new_namespace\n"
    "exec(compile('', '<cell>', 'exec'), new_namespace({}))\n"
    "print('ready', flush=True)\n"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1e3:8.1f} ms   p99 {pct(values, 0.99) * 1e3:8.1f} ms   (n={len(values)})"


async def empty_cell(client: LocalSandboxClient, sandbox_id: str) -> None:
    reply = parse_cell_reply(await client.call(sandbox_id, "run_cell", {"code": ""}, WAIT), client.limits)
    assert reply.status == "ok", reply


async def ready_times(client: LocalSandboxClient, n: int, pause: float) -> list[float]:
    times = []
    for _ in range(n):
        await asyncio.sleep(pause)  # with a pause, the pool refills in the background
        start = time.perf_counter()
        sandbox = await client.create(REQUEST)
        await empty_cell(client, sandbox.id)
        times.append(time.perf_counter() - start)
        await client.delete(sandbox.id)
    return times


def baseline_times(n: int) -> list[float]:
    python = os.path.realpath(sys.executable)
    argv = sandbox_command([python, "-S", "-P", "-c", BASELINE_CODE])
    times = []
    for _ in range(n):
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = proc.stdout.readline()
        times.append(time.perf_counter() - start)
        proc.wait()
        assert line == b"ready\n", line
    return times


def pss_kib(pids: list[int]) -> int:
    """Total Pss in KiB over the processes `pids`."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total


async def pss_mib(client: LocalSandboxClient, sandbox_ids: list[str]) -> tuple[list[float], int]:
    """PSS of each sandbox (its supervisor and the model's processes), and the most processes one had."""
    await asyncio.sleep(0.5)
    trees = [proctree.sandbox_processes(proctree.supervisor_of(client, i)) for i in sandbox_ids]
    return [pss_kib(pids) / 1024 for pids in trees], max(map(len, trees))


async def idle_pss(client: LocalSandboxClient, n: int) -> tuple[list[float], int]:
    sandboxes = [await client.create(REQUEST) for _ in range(n)]
    for sandbox in sandboxes:
        await empty_cell(client, sandbox.id)  # idle = created, one cell run, waiting for the next
    measured = await pss_mib(client, [s.id for s in sandboxes])
    await client.bulk_delete([s.id for s in sandboxes])
    return measured


async def concurrent(client: LocalSandboxClient, n: int) -> tuple[int, float, list[float]]:
    start = time.perf_counter()
    sandboxes = await asyncio.gather(*(client.create(REQUEST) for _ in range(n)))
    code = {"code": "x = torch.randn(64, 64)\nprint(float((x @ x).sum()) == float((x @ x).sum()))"}

    async def answer(sandbox_id: str) -> bool:
        reply = parse_cell_reply(await client.call(sandbox_id, "run_cell", code, WAIT), client.limits)
        return reply.status == "ok" and reply.stdout == "True\n"

    results = await asyncio.gather(*(answer(s.id) for s in sandboxes), return_exceptions=True)
    elapsed = time.perf_counter() - start
    pss, _ = await pss_mib(client, [s.id for s in sandboxes])
    await client.bulk_delete([s.id for s in sandboxes])
    return sum(r is True for r in results), elapsed, pss


async def optimiser_step(client: LocalSandboxClient) -> float:
    sandbox = await client.create(REQUEST)
    code = "m = torch.nn.Linear(8, 1)\nopt = torch.optim.Adam(m.parameters())\nm(torch.ones(8)).sum().backward()\nopt.step()"
    start = time.perf_counter()
    reply = parse_cell_reply(await client.call(sandbox.id, "run_cell", {"code": code}, WAIT), client.limits)
    elapsed = time.perf_counter() - start
    assert reply.status == "ok", reply
    await client.delete(sandbox.id)
    return elapsed


CPU_WORK = {"code": "import time\nstart = time.perf_counter()\nx = 0\nfor i in range(5_000_000):\n    x += i\n"
                    "print(time.perf_counter() - start)"}
# Matrix products release the GIL: 8 threads keep 8 CPUs busy (a pure-Python spin would keep one).
BUSY_THREADS = {"code": "import threading\ndef spin():\n    x = torch.randn(256, 256)\n    while True:\n        x @ x\n"
                        "for _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\n"}


# Writing as fast as it can: its supervisor reads and counts every byte (output_bytes are kept).
FLOOD = {"code": "import os\nwhile True:\n    os.write(1, b'x' * 65536)\n"}


async def cpu_work_time(client: LocalSandboxClient, sandbox_id: str, n: int) -> float:
    """Median seconds of n CPU-bound cells."""
    replies = [parse_cell_reply(await client.call(sandbox_id, "run_cell", CPU_WORK, WAIT), client.limits) for _ in range(n)]
    return statistics.median(float(r.stdout) for r in replies)


async def cpu_share(client: LocalSandboxClient, n: int) -> tuple[float, float]:
    """Median seconds of a CPU-bound cell alone, and while a neighbour spins 8 threads (which outlive their cell)."""
    probe = await client.create(REQUEST)
    alone = await cpu_work_time(client, probe.id, n)
    neighbour = await client.create(REQUEST)
    reply = parse_cell_reply(await client.call(neighbour.id, "run_cell", BUSY_THREADS, WAIT), client.limits)
    assert reply.status == "ok", reply
    loaded = await cpu_work_time(client, probe.id, n)
    await client.bulk_delete([probe.id, neighbour.id])
    return alone, loaded


async def flood_share(client: LocalSandboxClient, n: int) -> tuple[float, float]:
    """Median seconds of a CPU-bound cell alone, and while 3 neighbours flood their stdout (the CPU
    their supervisors spend relaying it is charged to the neighbours' cpu cgroups)."""
    probe = await client.create(REQUEST)
    alone = await cpu_work_time(client, probe.id, n)
    neighbours = [await client.create(REQUEST) for _ in range(3)]
    floods = [asyncio.create_task(client.call(s.id, "run_cell", FLOOD, WAIT)) for s in neighbours]
    await asyncio.sleep(1.0)
    loaded = await cpu_work_time(client, probe.id, n)
    for flood in floods:
        flood.cancel()  # a cancelled request stops its sandbox, which is deleted next
    await asyncio.gather(*floods, return_exceptions=True)
    await client.bulk_delete([probe.id, *(s.id for s in neighbours)])
    return alone, loaded


async def basics(quick: bool) -> dict:
    """Ready p50 (pool refilled), empty cell p50 and mean PSS per idle sandbox, in this process's mode."""
    client = LocalSandboxClient()
    try:
        first = await client.create(REQUEST)
        await empty_cell(client, first.id)
        cells = []
        for _ in range(100 if quick else 300):
            t = time.perf_counter()
            await empty_cell(client, first.id)
            cells.append(time.perf_counter() - t)
        await client.delete(first.id)
        ready = await ready_times(client, 20 if quick else 60, pause=0.1)
        pss, _ = await idle_pss(client, 16)
        alone, loaded = await cpu_share(client, 3)
        return {"mode": client.isolation_mode, "ready": pct(ready, 0.5), "cell": pct(cells, 0.5),
                "pss": statistics.mean(pss), "share": loaded / alone}
    finally:
        client.teardown()


def compare_modes(user: str, quick: bool) -> None:
    root = asyncio.run(basics(quick))
    with tempfile.TemporaryDirectory() as home:
        os.chown(home, pwd.getpwnam(user).pw_uid, -1)
        argv = ["runuser", "-u", user, "--", "env", f"HOME={home}", sys.executable, __file__, "--basics"]
        done = subprocess.run(argv + ["--quick"] * quick, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the rootless run as {user} failed:\n{done.stderr[-2000:]}")
    rootless = json.loads(done.stdout.splitlines()[-1])
    print(f"root     : {root['mode']}\nrootless : {rootless['mode']}\n")
    print(f"{'':22} {'root':>10} {'rootless':>10} {'ratio':>7}   (target <= 1.5x)")
    for key, label, unit, scale in (("ready", "ready p50", "ms", 1e3), ("cell", "empty cell p50", "ms", 1e3),
                                    ("pss", "PSS per idle sandbox", "MiB", 1)):
        a, b = root[key] * scale, rootless[key] * scale
        print(f"{label:22} {a:7.2f} {unit:3}{b:7.2f} {unit:3}{b / a:6.2f}x")
    print(f"{'CPU-bound cell next to 8 busy threads':38}: root {root['share']:.2f}x, rootless {rootless['share']:.2f}x"
          " its time alone (target <= 1.5x)")


async def main(quick: bool) -> None:
    n_ready, n_base, n_cells = (30, 3, 200) if quick else (100, 5, 500)
    client = LocalSandboxClient()
    start = time.perf_counter()
    first = await client.create(REQUEST)
    await empty_cell(client, first.id)
    print(f"first create (starts the fork server) -> first answer: {time.perf_counter() - start:.2f} s")

    cells = []
    for _ in range(n_cells):
        t = time.perf_counter()
        await empty_cell(client, first.id)
        cells.append(time.perf_counter() - t)
    await client.delete(first.id)

    pooled = await ready_times(client, n_ready, pause=0.1)
    burst = await ready_times(client, n_ready, pause=0.0)
    base = baseline_times(n_base)
    pss, procs = await idle_pss(client, 32)
    answered, elapsed, busy_pss = await concurrent(client, 64)
    step = await optimiser_step(client)
    alone, loaded = await cpu_share(client, 5)
    flood_alone, flooded = await flood_share(client, 5)
    mode = client.cgroup_mode
    client.teardown()

    ratio = pct(base, 0.5) / pct(pooled, 0.5)
    print(f"ready, fork server, pool refilled : {ms(pooled)}")
    print(f"ready, fork server, back to back  : {ms(burst)}")
    print(f"ready, fresh interpreter (naive)  : {ms(base)}")
    print(f"ready speed-up (p50, pooled)      : {ratio:.0f}x   (back to back {pct(base, 0.5) / pct(burst, 0.5):.0f}x)")
    print(f"empty cell round trip             : {ms(cells)}")
    print(
        f"PSS per idle sandbox (32 idle)    : mean {statistics.mean(pss):.1f} MiB   max {max(pss):.1f} MiB"
        f"   ({procs} processes each)"
    )
    print(f"concurrent sandboxes answering    : {answered}/64 in {elapsed:.1f} s (create + one matmul cell each)")
    print(f"PSS per sandbox (those 64)        : mean {statistics.mean(busy_pss):.1f} MiB   max {max(busy_pss):.1f} MiB")
    print(f"first optimiser step in a sandbox : {step * 1e3:.1f} ms (Linear + Adam + backward + step)")
    print(f"CPU-bound cell, alone / neighbour : {alone * 1e3:.0f} ms / {loaded * 1e3:.0f} ms with 8 busy threads next door"
          f" = {loaded / alone:.2f}x (target <= 1.5x; {mode})")
    print(f"CPU-bound cell, alone / flooding  : {flood_alone * 1e3:.0f} ms / {flooded * 1e3:.0f} ms with 3 neighbours"
          f" flooding stdout = {flooded / flood_alone:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--rootless-as", metavar="USER", help="as root: compare root and rootless, the latter as USER")
    parser.add_argument("--basics", action="store_true", help=argparse.SUPPRESS)  # the rootless half, as JSON
    args = parser.parse_args()
    if args.basics:
        print(json.dumps(asyncio.run(basics(args.quick))))
    elif args.rootless_as:
        compare_modes(args.rootless_as, args.quick)
    else:
        asyncio.run(main(args.quick))
