"""Soak: 1000 rollouts through Environment.evaluate (reference policy, concurrency 32, the 45 tasks
in turn). Passes when every reward is 1.0 with no scoring_error and, afterwards, no sandbox process
(so no sandbox scratch dir: each sandbox's /tmp is a tmpfs in its own mount namespace) and no extra
open file descriptor of this process is left. Prints this process's RSS before, midway and at the end.

    .venv/bin/python bench/soak.py [--rollouts N]
"""

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import verifiers as vf

import pytorch_env
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from tests.support import proctree

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 32
SNAPSHOTS = 10  # looks at the process tree during the run


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def open_fds() -> dict[str, str]:
    """This process's open file descriptors and what each points to."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the directory listing's own fd, closed by now
    return fds


async def soak(rollouts: int) -> dict:
    """Run the soak; returns its figures and the list of problems (empty when it passes)."""
    server = subprocess.Popen([sys.executable, "-m", "tests.support.policy_server", "--port", "0"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().strip()
    os.environ.setdefault("SOAK_API_KEY", "unused")
    fds_before, rss = open_fds(), {"before": rss_mib()}
    seen: dict[int, int] = {}  # every process the run started, as proctree names them

    def look(all_outputs, new_outputs, metadata) -> None:
        done = len(all_outputs)
        if done % max(1, rollouts // SNAPSHOTS) == 0:
            seen.update({p: t for p, t in proctree.tree([os.getpid()]).items() if p not in (os.getpid(), server.pid)})
        if done == rollouts // 2:
            rss["middle"] = rss_mib()

    start = time.perf_counter()
    try:
        env = pytorch_env.load_environment()
        rows = env.get_dataset().to_list()
        inputs = [{**rows[i % len(rows)], "example_id": i} for i in range(rollouts)]
        client = vf.ClientConfig(client_type="openai_chat_completions", api_key_var="SOAK_API_KEY", api_base_url=url)
        out = await env.generate(inputs, client=client, model="reference", max_concurrent=CONCURRENCY,
                                 independent_scoring=True, state_columns=["scoring_error"], on_progress=look)
        env.transport.client.teardown()
    finally:
        server.terminate()
        server.wait()
    elapsed = time.perf_counter() - start
    outputs = out["outputs"]
    rss["end"] = rss_mib()
    left = [p for p in proctree.tree([os.getpid()]) if p != os.getpid()] + proctree.survivors(seen)
    figures = {
        "rollouts": len(outputs),
        "seconds": elapsed,
        "at 1.0": sum(o["reward"] == 1.0 for o in outputs),
        "scoring errors": sum(o["scoring_error"] is not None for o in outputs),
        "processes seen": len(seen),
        "processes left": sorted(set(left)),
        "fds before": len(fds_before),
        "fds after": len(fds_after := open_fds()),
        "fds left": {fd: target for fd, target in fds_after.items() if fds_before.get(fd) != target},
        "rss": rss,
    }
    problems = []
    if figures["at 1.0"] != rollouts or figures["rollouts"] != rollouts:
        bad = [o["info"]["task_id"] for o in outputs if o["reward"] != 1.0][:5]
        problems.append(f"{figures['at 1.0']}/{rollouts} rollouts at 1.0 (first misses: {bad})")
    if figures["scoring errors"]:
        problems.append(f"{figures['scoring errors']} scoring errors")
    if left:
        problems.append(f"left running: {sorted(set(left))}")
    if figures["fds left"]:
        problems.append(f"file descriptors opened and left open: {figures['fds left']}")
    figures["problems"] = problems
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    figures = asyncio.run(soak(parser.parse_args().rollouts))
    rss = figures["rss"]
    print(f"{figures['rollouts']} rollouts in {figures['seconds']:.1f} s "
          f"({figures['rollouts'] / figures['seconds']:.1f}/s, concurrency {CONCURRENCY})")
    print(f"at 1.0: {figures['at 1.0']}   scoring_error: {figures['scoring errors']}")
    print(f"processes of the run (bwrap, fork server, sandboxes): {figures['processes seen']} seen in "
          f"{SNAPSHOTS} looks during the run, {len(figures['processes left'])} left")
    print(f"open fds of this process: {figures['fds before']} before, {figures['fds after']} after, "
          f"{len(figures['fds left'])} opened by the run and left open")
    print(f"RSS of this process: before {rss['before']:.0f} MiB, middle {rss['middle']:.0f} MiB, "
          f"end {rss['end']:.0f} MiB")
    print("soak FAILED: " + "; ".join(figures["problems"]) if figures["problems"] else "soak passed")
    return 1 if figures["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
