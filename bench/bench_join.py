"""What a process's move into its sandbox's cgroup costs: a fork that exits at once, against one
that first joins a sandbox's model cgroup (cgroups.join, as a shell or a trial's caller does when it
starts), back to back and with 50 ms between them (as a rollout's commands come). Run as root
(or with a delegated cgroup), on whichever hierarchy this machine has:

    .venv/bin/python bench/bench_join.py
"""

import os
import statistics
import time

from ptenv.inside import cgroups
from ptenv.inside.protocol import Limits

ROUNDS = 200


def fork_times(fds: dict[str, int] | None, gap: float) -> list[float]:
    times = []
    for _ in range(ROUNDS):
        time.sleep(gap)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            if fds:
                cgroups.join(fds)
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    paths = cgroups.make_client_dirs(f"ptenv-{os.getpid()}-be9c0000")
    dirs = {c: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for c, path in paths.items()}
    fds = cgroups.make_sandbox(dirs, "sandbox-0", Limits())
    print(cgroups.describe(paths))
    # Measured from a child that moved where a supervisor lives, as a supervisor forks them.
    pid = os.fork()
    if pid == 0:
        cgroups.charge_cpu(fds)
        for gap in (0.0, 0.05):
            for name, join in (("fork, exit", None), ("fork, join, exit", fds)):
                times = sorted(fork_times(join, gap))
                print(f"{gap * 1000:2.0f} ms apart  {name:<17} p50 {statistics.median(times) * 1000:6.2f} ms"
                      f"  p90 {times[int(0.9 * ROUNDS)] * 1000:6.2f} ms", flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    cgroups.remove_client_dirs(paths)


if __name__ == "__main__":
    main()
