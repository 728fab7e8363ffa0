"""What one reply costs the harness. The sandbox's supervisor, outside the sandbox's memory limit:
its peak RSS growth (VmHWM) while it reads the interpreter's reply to `result`, for valid results
of growing size and for the hostile replies of issue 22, and while it replies to the largest trial
(issue 34's F7). The host: the time to search a hostile final message for the answer, and the
event loop's lag meanwhile (F3).

    .venv/bin/python bench/bench_replies.py

Targets (issues 22, 34): a valid read-back of N MiB costs at most 2N + 16 MiB; a hostile reply, and
the largest trial's, at most 64 MiB, which the cap on a tensor's size (MAX_TENSOR_BYTES) keeps for
every read-back, the largest valid one too. Each case runs in a fresh sandbox (the peak is the
supervisor's high-water mark). The event loop's lag stays under 50 ms while a final message is searched.
"""

import asyncio
import statistics
import time

from ptenv.host import answer
from ptenv.host.assess import assess_function
from ptenv.host.blame import ModelFault
from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import HIDDEN_OUTPUT_CAP, MAX_HIDDEN_CASES, MAX_HIDDEN_OUTPUTS, MAX_TENSOR_BYTES, Limits
from ptenv.tasks.fn_intermediate import SEGMENT_MEAN
from ptenv.tasks.functions import HiddenCases
from tests.support.hostile_functions import HEADER, TRIAL_MESSAGES
from tests.support.sandbox import new_box

PATCH_JSON = "import json\nencode = json._default_encoder.encode\njson._default_encoder.encode = lambda o: {} if 'traceback' not in o else encode(o)\n"
VALID = {f"valid, {n} MiB": (f"result = torch.ones({n << 18})", n) for n in (1, 16, MAX_TENSOR_BYTES >> 20)}
HOSTILE = {
    "JSON bomb, 40 MB of [[]]": PATCH_JSON.format("'[' + '[[]],' * 8_000_000 + '[]]'") + "result = torch.zeros(2)",
    "nested 10,000 deep": PATCH_JSON.format("'[' * 10000 + ']' * 10000") + "result = torch.zeros(2)",
    "type name of 42 MB": "result = type('\"' * 42_000_000, (), {})()",
    "declares 4 bytes, sends 60 MiB": "import ptenv.inside.codec as codec\n"
                                      "codec.to_bytes = lambda t: ({'dtype': 'float32', 'shape': [1]}, bytearray(60 << 20))\n"
                                      "result = torch.zeros(1)",
    # The one kind a supervisor reads whole: bytes of the declared size (any bytes are some float's;
    # a bool's must be 0 or 1, which the host checks), costing what a valid read-back of that size costs.
    "declares the cap of bool, sends 2s": "import ptenv.inside.codec as codec\n"
                                          f"codec.to_bytes = lambda t: ({{'dtype': 'bool', 'shape': [{MAX_TENSOR_BYTES}]}}, bytearray(b'\\2') * {MAX_TENSOR_BYTES})\n"
                                          "result = torch.zeros(1)",
}


def peak_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


async def cost(client: LocalSandboxClient, code: str) -> tuple[float, str]:
    box = await new_box(client)
    try:
        reply = await box.cell(code)
        assert reply.status == "ok", reply
        before = peak_mib(box.supervisor[0])
        try:
            outcome = f"a tensor of {(await box.result()).numel()} elements"
        except ModelFault as e:
            outcome = f"invalid: {str(e)[:70]}"
        return peak_mib(box.supervisor[0]) - before, outcome
    finally:
        await client.delete(box.id)


async def largest_trial(client: LocalSandboxClient) -> tuple[float, str]:
    """The supervisor's peak growth while it replies to a trial of MAX_HIDDEN_CASES cases, each
    returning MAX_HIDDEN_OUTPUTS outputs at the cap."""
    box = await new_box(client)
    try:
        before = peak_mib(box.supervisor[0])
        n = HIDDEN_OUTPUT_CAP // 4 * 3 // 4  # float32 elements whose base64 is at the cap
        source = HEADER.replace("{name}", SEGMENT_MEAN.name) + f"    return tuple(torch.zeros({n}) for _ in range({MAX_HIDDEN_OUTPUTS}))\n"
        outcome = await assess_function(client.call, box.id, source=source, name=SEGMENT_MEAN.name,
                                        inputs=SEGMENT_MEAN.instance("b", 3).inputs(),
                                        cases=HiddenCases("bench", MAX_HIDDEN_CASES).of(SEGMENT_MEAN, 3), allowlist=None,
                                        limits=client.limits, partial_credit=False)
        return peak_mib(box.supervisor[0]) - before, outcome.verdict.reason[:70]
    finally:
        await client.delete(box.id)


async def search_lag(message: str) -> tuple[float, float, float]:
    """(ms to search the message, p50 and max ms of the event loop's lag meanwhile), the search off
    the loop as ptenv/env/rollout.py runs it."""
    lags, done = [], False

    async def tick() -> None:
        while not done:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - start - 0.001) * 1e3)

    ticker = asyncio.create_task(tick())
    start = time.perf_counter()
    try:
        await asyncio.to_thread(answer.function_source, message, "f")
    except answer.MessageTooLong:
        pass
    took = (time.perf_counter() - start) * 1e3
    done = True
    await ticker
    return took, statistics.median(lags), max(lags)


async def main() -> None:
    client = LocalSandboxClient(Limits(cell_timeout=30))
    try:
        print(f"{'reply':36} {'supervisor peak growth':>24}  target  outcome")
        for name, (code, n) in VALID.items():
            grew, outcome = await cost(client, code)
            print(f"{name:36} {grew:20.1f} MiB  {2 * n + 16:4} MiB  {outcome}")
        for name, code in HOSTILE.items():
            grew, outcome = await cost(client, code)
            print(f"{name:36} {grew:20.1f} MiB  {64:4} MiB  {outcome}")
        grew, outcome = await largest_trial(client)
        print(f"{'largest trial (32 x 8 x 128 KiB)':36} {grew:20.1f} MiB  {64:4} MiB  {outcome}")
    finally:
        client.teardown()
    print(f"\n{'final message (F3)':36} {'search ms':>10} {'loop lag p50 ms':>16} {'max ms':>8}  target: max < 50 ms")
    messages = {name: make("f") for name, make in TRIAL_MESSAGES.items()}
    messages["256 KiB of fence openers"] = "```" * (answer.MAX_MESSAGE_CHARS // 3)
    messages["256 KiB in one unclosed block"] = "```python\n" + "a" * (answer.MAX_MESSAGE_CHARS - 10)
    for name, message in messages.items():
        took, p50, worst = await search_lag(message)
        print(f"{name:36} {took:10.1f} {p50:16.2f} {worst:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
