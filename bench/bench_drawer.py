"""What a rollout's draw costs the event loop: its lag, and the socket round trips it still makes,
while level-3 rollouts' hidden cases and budgets are drawn (issue 36: nothing CPU-heavy beside the loop).

    .venv/bin/python bench/bench_drawer.py [--rollouts 40]
    PYTHONPATH=/tmp/before .venv/bin/python bench/bench_drawer.py     # a checkout with a drawing thread

The loop ticks every 5 ms and makes round trips on a socket pair, as it does with sandboxes' channels,
first idle for 3 s, then while `--rollouts` draws run, each its cases and then its budgets, over four
families of the efficiency level. A drawing thread holds the GIL, and each of the loop's socket calls
waits to take it back; the drawing process (ptenv/env/drawer.py) competes for a core only.
"""

import argparse
import asyncio
import socket
import time

from ptenv.env import rollout
from ptenv.tasks import efficiency
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.rows import parse_row
from ptenv.tasks.tiers import find_family

FAMILIES = ("tensor_ops/trimmed_mean_fn", "nn_modules/soft_pool2d_fn", "tensor_ops/discounted_returns_fn",
            "autograd/lsq_quantize_backward_fn")
TICK = 0.005


def budgets(family_id: str, drawn: list):
    if hasattr(rollout.DRAWER, "pid"):  # the drawing process
        return rollout.DRAWER.submit("budgets", family_id, drawn)
    return rollout.DRAWER.submit(efficiency.budgets, find_family(family_id)[1], drawn)  # a drawing thread


async def draw(family_id: str, cases: HiddenCases) -> None:
    """A level-3 rollout's draw: its cases, then their budgets."""
    row = parse_row(find_family(family_id)[1].instance("train", 3, efficiency.LEVEL).row(), family_id)
    drawn = await rollout.start_draw(row, cases).cases
    await asyncio.wrap_future(budgets(family_id, drawn))


async def ticks(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(TICK)
        lags.append(time.monotonic() - start - TICK)


async def round_trips(stop: asyncio.Event, count: list[int]) -> None:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    buf = bytearray(64)
    while not stop.is_set():
        await loop.sock_sendall(ours, bytes(64))
        await loop.sock_recv_into(theirs, buf)
        count[0] += 1
        await asyncio.sleep(0)  # neither call need wait, and then neither yields


async def main(rollouts: int) -> None:
    cases = HiddenCases("bench", 8)
    await asyncio.gather(*[draw(f, cases) for f in FAMILIES])  # imports, and the drawing process's start
    print(f"drawing in {'a process' if hasattr(rollout.DRAWER, 'pid') else 'a thread'}; {rollouts} level-3 draws "
          f"over {len(FAMILIES)} families", flush=True)
    for phase in ("idle", "drawing"):
        stop, lags, count = asyncio.Event(), [], [0]
        start = time.monotonic()
        loop_work = [asyncio.create_task(ticks(stop, lags)), asyncio.create_task(round_trips(stop, count))]
        if phase == "idle":
            await asyncio.sleep(3)
        else:
            await asyncio.gather(*[draw(FAMILIES[k % len(FAMILIES)], cases) for k in range(rollouts)])
        stop.set()
        await asyncio.gather(*loop_work)
        seconds, lags = time.monotonic() - start, sorted(lags)
        print(f"{phase:8s} {seconds:5.1f} s   loop lag p50 {lags[len(lags) // 2] * 1e3:6.2f} ms   p99 "
              f"{lags[int(len(lags) * 0.99)] * 1e3:7.2f} ms   max {lags[-1] * 1e3:6.1f} ms   the loop's round trips "
              f"{count[0] / seconds:8.0f}/s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=40)
    asyncio.run(main(parser.parse_args().rollouts))
