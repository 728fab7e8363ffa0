"""What one read-back reply costs the sandbox's supervisor, the harness process outside the
sandbox's memory limit: its peak RSS growth (VmHWM) while it reads the interpreter's reply to
`result`, for valid results of growing size and for the hostile replies of issue 22.

    .venv/bin/python bench/bench_replies.py

Targets (issue 22): a valid read-back of N MiB costs at most 2N + 16 MiB; a hostile reply at most
64 MiB, which the cap on a tensor's size (MAX_TENSOR_BYTES) keeps for every reply, the largest
valid one too. Each case runs in a fresh sandbox (the peak is the supervisor's high-water mark).
"""

import asyncio

from ptenv.host.blame import ModelFault
from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import MAX_TENSOR_BYTES, Limits
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
    finally:
        client.teardown()


if __name__ == "__main__":
    asyncio.run(main())
