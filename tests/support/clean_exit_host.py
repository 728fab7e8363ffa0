"""A host process for the clean-exit test and benchmark (tests/test_clean_exit.py, bench/clean_exit.py):
local sandboxes made through the real client, then it waits to be ended.

    python -m tests.support.clean_exit_host ready      3 sandboxes, a cell run in one, then prints
                                                      "ready"; exits normally on "exit" on stdin
    python -m tests.support.clean_exit_host starting   asks for a sandbox, prints "starting" as soon as
                                                      the fork server's bwrap runs (torch still loading),
                                                      and "ready" if the sandbox ever comes
"""

import asyncio
import sys

from ptenv.host import transports



def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def ready(transport) -> None:
    client = transport.client
    ids = [(await client.create(transport.request)).id for _ in range(3)]
    doc = await client.call(ids[0], "run_cell", {"code": "print(6 * 7)"}, 60)
    assert doc["stdout"] == "42\n", doc
    say("ready")
    if await asyncio.to_thread(sys.stdin.readline) == "exit\n":
        return  # a normal exit: the client's atexit teardown runs


async def starting(transport) -> None:
    client = transport.client
    create = asyncio.create_task(client.create(transport.request))
    while client.pool.forkserver is None:
        await asyncio.sleep(0.001)
    say("starting")
    await create
    say("ready")
    await asyncio.Event().wait()  # until killed


def main() -> None:
    mode = sys.argv[1]
    transport = transports.create("local")
    asyncio.run({"ready": ready, "starting": starting}[mode](transport))


if __name__ == "__main__":
    main()
