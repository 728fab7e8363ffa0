"""The machine CPU a function task's trial costs per rollout, at the default number of cases.

    .venv/bin/python bench/bench_hidden.py [--rounds 3]

For every function family: its level-1 trial with the reference, then its level-2 trial, allowlist
on, with its honest implementation (`by_hand`, or the reference), and where it has one, its level-3
trial with its expert implementation (the efficiency level: the trace, the graphs' run and the
budgets), `rounds` times each,
down the path a rollout takes (ptenv/env/rollout.py: the session ended, then the trial; at level 2
in a fresh sandbox of the trial zygote, deleted after). CPU is counted where it is spent: the host
process (searching the answer, encoding the cases, parsing the reply, grading) with its drawing
process (level 3's budgets), the rollout's
sandbox (its supervisor and every caller it forked and reaped), and the fork server and trial zygote
(forking sandboxes, and those they reaped: a trial's sandbox once deleted). Each is
utime + stime + cutime + cstime. Apart: the draw of a rollout's cases (gated: the reference, its
float64 recompute and every listed implementation run on the host), which every rollout pays
(issue 35), as the CPU time of a thread of this process, median over `rounds` fresh nonces after a first
draw (which imports what the family's implementations use, once per process).
Target (issues 23, 26, 35): at most 100 ms of machine CPU per rollout at the default N, allowlist on or off.
Level 3's total against level 2's, family by family, is the efficiency meter's overhead (issue 38).
"""

import argparse
import asyncio
import resource
import statistics
import time
from pathlib import Path

from ptenv.env.rollout import DRAWER, Draw, assess_rollout
from ptenv.host import transports
from ptenv.inside.protocol import Limits
from ptenv.tasks import efficiency
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, HiddenCases
from ptenv.tasks.rows import parse_row
from ptenv.tasks.tiers import FUNCTION_TIERS, allowlist_base
from tests.support.proctree import cpu, tree
from tests.support.sandbox import new_box

REAPED = 0.5  # seconds for a fork server to reap a deleted sandbox (it looks every 0.2 s)


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def host_cpu() -> float:
    return own_cpu() + cpu(DRAWER.pid)


def fork_servers(bwrap_pid: int) -> list[int]:
    """The fork server and the trial zygote: the processes under bwrap that run ptenv.inside.main forkserver."""
    return [pid for pid in tree([bwrap_pid]) if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def draw_here(cases: HiddenCases, family, row, nonce: str) -> tuple[Draw, float]:
    """A rollout's draw of its cases, made in this thread rather than the drawing process, so that
    its CPU is counted apart from the trial's; and that CPU in seconds."""
    start = time.thread_time()
    drawn = cases.of(family, row.seed, nonce)
    seconds = time.thread_time() - start
    future = asyncio.get_running_loop().create_future()
    future.set_result(drawn)
    return Draw(nonce, cases.secret_id, future), seconds


async def trial_cpu(transport, box, row, source: str, draw: Draw, servers: list[int]) -> tuple[float, float, float]:
    """(host s, sandboxes s, wall s) of one trial of `source`, as a rollout that ends runs it: the host
    with its drawing process, which computes level 3's budgets."""
    h0, s0, w0 = host_cpu(), cpu(box.supervisor[0]) + sum(map(cpu, servers)), time.perf_counter()
    outcome = await assess_rollout(row, transport, box.id, final_message=f"```python\n{source}```", draw=draw,
                                   partial_credit=False)
    host, wall = host_cpu() - h0, time.perf_counter() - w0
    await asyncio.sleep(REAPED)
    assert outcome.verdict.score == 1.0, (row.task_id, outcome.verdict.reason, outcome.scoring_error)
    return host, cpu(box.supervisor[0]) + sum(map(cpu, servers)) - s0, wall


async def main(rounds: int) -> None:
    transport = transports.local(Limits(), allowlist_base())
    cases = HiddenCases("bench", DEFAULT_HIDDEN_CASES)
    DRAWER.submit("budgets", FUNCTION_TIERS["basic"][0].id, []).result()  # its start is no trial's CPU
    rows = []
    try:
        for family in [f for members in FUNCTION_TIERS.values() for f in members]:
            plays = [("", 1, family.reference), ("2", 2, family.by_hand)]
            plays += [("3", efficiency.LEVEL, efficiency.expert(family))] if efficiency.LEVEL in family.levels else []
            for label, level, source in plays:
                row = parse_row(family.instance("bench", 0, level).row(), family.id)
                cases.of(family, row.seed)  # imports what the family's implementations use, once per process
                draws, runs = [], []
                for k in range(rounds):
                    draw, seconds = draw_here(cases, family, row, f"rollout {k}")
                    draws.append(seconds)
                    box = await new_box(transport.client)
                    await asyncio.sleep(REAPED)  # the pool's refill, which is not the trial's
                    servers = fork_servers(transport.client.pool.forkserver.pid)
                    runs.append(await trial_cpu(transport, box, row, source, draw, servers))
                    await transport.client.delete(box.id)
                    await asyncio.sleep(REAPED)  # reaped now, not in the next trial's count
                host, sandbox, wall = (statistics.median(r[i] for r in runs) * 1e3 for i in range(3))
                rows.append((family.id, label, statistics.median(draws) * 1e3, host, sandbox, wall))
    finally:
        transport.client.teardown()
    print(f"{'family':45s} {'':3s} {'draw ms':>8s} {'host ms':>8s} {'sandbox ms':>10s} {'total ms':>9s} {'wall ms':>8s}")
    for family_id, label, draw, host, sandbox, wall in rows:
        print(f"{family_id:45s} {label:3s} {draw:8.1f} {host:8.1f} {sandbox:10.1f} {draw + host + sandbox:9.1f} {wall:8.1f}")
    draws = [draw for _, label, draw, _, _, _ in rows if not label]
    print(f"a rollout's draw (host CPU): median {statistics.median(draws):.1f} ms, max {max(draws):.1f} ms over "
          f"{len(draws)} families")
    for label, name in (("", "level 1"), ("2", "level 2, allowlist on"), ("3", "level 3, the efficiency level")):
        totals = [draw + host + sandbox for _, lab, draw, host, sandbox, _ in rows if lab == label]
        target = "target <= 100 ms" if label != "3" else "the meter's overhead: against level 2 of the same families"
        print(f"machine CPU per rollout (N={DEFAULT_HIDDEN_CASES}), {name}: median {statistics.median(totals):.1f} "
              f"ms, max {max(totals):.1f} ms over {len(totals)} families, the draw included; {target}")
    by_family = {(family_id, label): draw + host + sandbox for family_id, label, draw, host, sandbox, _ in rows}
    ratios = [by_family[f, "3"] / by_family[f, "2"] for f, label in by_family if label == "3"]
    if ratios:
        print(f"level 3 against level 2, family by family: median {statistics.median(ratios):.2f}x, "
              f"max {max(ratios):.2f}x (the trace, the second trial and the budget)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
