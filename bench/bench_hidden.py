"""The machine CPU a function task's trial costs per rollout, at the default number of cases.

    .venv/bin/python bench/bench_hidden.py [--rounds 3]

For every function family: one sandbox with the example preloaded, then the reference answer's
trial (ptenv.host.assess.assess_function) `rounds` times; then its hardest level's trial, allowlist
on, with its honest implementation (`by_hand`, or the reference). CPU is counted where it is spent:
the host process (encoding the cases, parsing the reply, grading) and the sandbox (its supervisor
and every caller it forked and reaped: utime + stime + cutime + cstime of the supervisor). The
one-time drawing of each task's cases (gated, cached per environment) is printed apart.
Target (issues 23, 26, 35): at most 100 ms of machine CPU per rollout at the default N, allowlist on or off.
"""

import argparse
import asyncio
import os
import resource
import statistics
import time
from pathlib import Path

from ptenv.host import requests
from ptenv.host.assess import assess_function
from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import Limits
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, LEVELS, HiddenCases
from ptenv.tasks.tiers import FUNCTION_TIERS
from tests.support.sandbox import new_box

TICK = os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sandbox_cpu(supervisor_pid: int) -> float:
    """The supervisor's CPU and that of its reaped children (the callers), in seconds."""
    fields = Path(f"/proc/{supervisor_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICK


async def main(rounds: int) -> None:
    limits = Limits()
    client = LocalSandboxClient(limits)
    hidden = HiddenCases("bench", DEFAULT_HIDDEN_CASES)
    rows = []
    try:
        for family in [f for members in FUNCTION_TIERS.values() for f in members]:
            start = time.perf_counter()
            cases = hidden.of(family, 0)
            draw_ms = (time.perf_counter() - start) * 1e3
            box = await new_box(client)
            await requests.preload(client.call, box.id, family.instance("bench", 0).inputs(), timeout=60, limits=limits)
            runs = [("", family.reference, None), ("2", family.by_hand, family.ban(LEVELS[-1]))]
            for label, source, ban in runs:
                host, sandbox, wall = [], [], []
                for _ in range(rounds):
                    h0, s0, w0 = own_cpu(), sandbox_cpu(box.supervisor[0]), time.perf_counter()
                    outcome = await assess_function(client.call, box.id, source=source, name=family.name, cases=cases,
                                                    ban=ban, limits=limits, partial_credit=False)
                    host.append(own_cpu() - h0)
                    sandbox.append(sandbox_cpu(box.supervisor[0]) - s0)
                    wall.append(time.perf_counter() - w0)
                    assert outcome.verdict.score == 1.0, (family.id, label, outcome.verdict.reason)
                rows.append((family.id, label, draw_ms, statistics.median(host) * 1e3,
                             statistics.median(sandbox) * 1e3, statistics.median(wall) * 1e3))
            await client.delete(box.id)
    finally:
        client.teardown()
    print(f"{'family':45s} {'':3s} {'draw ms':>8s} {'host ms':>8s} {'sandbox ms':>10s} {'total ms':>9s} {'wall ms':>8s}")
    for family_id, label, draw, host, sandbox, wall in rows:
        print(f"{family_id:45s} {label:3s} {draw:8.1f} {host:8.1f} {sandbox:10.1f} {host + sandbox:9.1f} {wall:8.1f}")
    for label, name in (("", "level 1"), ("2", "level 2, allowlist on")):
        totals = [host + sandbox for _, lab, _, host, sandbox, _ in rows if lab == label]
        if totals:
            print(f"machine CPU per rollout (N={DEFAULT_HIDDEN_CASES}), {name}: median {statistics.median(totals):.1f} "
                  f"ms, max {max(totals):.1f} ms over {len(totals)} families; target <= 100 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
