"""The supervisor's watch on its sandbox's memory. With a cgroup the kernel enforces the limit and
the watch reads its count of OOM kills. Without one, in a sandbox of its own, nothing but the watch
bounds it: it sums the model's processes' PSS, sooner the nearer they are to the limit (next_look)."""

import os
import socket
import time

from ptenv.inside import cgroups
from ptenv.inside.protocol import Limits

MEMORY_POLL = 0.2  # seconds between looks while a sandbox is far below its limit
MIN_POLL = 0.01  # seconds between looks however near it is
FAULT_RATE_KB = 6 << 20  # kB/s: the fastest a sandbox is taken to fault memory in (4.4 GiB/s measured, bench/bench_memory.py)
FAULT_KB = 64  # the most one page fault maps without huge pages: the kernel's fault-around, 64 KiB


def next_look(headroom_kb: float) -> float:
    """Seconds until the next look at a sandbox's memory: as long as its headroom lasts at
    FAULT_RATE_KB, between MIN_POLL and MEMORY_POLL. So a burst no faster than that passes the
    limit by at most what it faults in during MIN_POLL and three looks (docs/sandbox.md), and a
    sandbox far below its limit is looked at every MEMORY_POLL."""
    return min(MEMORY_POLL, max(MIN_POLL, headroom_kb / FAULT_RATE_KB))


def live_processes() -> dict[tuple[int, int], int]:
    """The processes of this sandbox that are not zombies (this /proc shows only our namespace), by
    (pid, start time), each with its page faults so far."""
    processes = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = parse_stat(f.read())
            except OSError:
                continue  # gone meanwhile
            if stat is not None:
                processes[int(name), stat[0]] = stat[1]
    return processes


def parse_stat(data: bytes) -> tuple[int, int] | None:
    """(start time, page faults) of a live process from its /proc stat, None for a zombie or a line
    that is not one. The command name is the model's: it may hold spaces and parentheses, so the
    fields are read after its last ')'."""
    try:
        fields = data.rsplit(b")", 1)[1].split()
        if fields[0] == b"Z":  # fields from the state on: minflt, majflt, starttime
            return None
        return int(fields[19]), int(fields[7]) + int(fields[9])
    except (IndexError, ValueError):
        return None


def live_pids() -> list[int]:
    return [pid for pid, _ in live_processes()]


def pss_kb(pid: int) -> int:
    """A process's proportional share of memory (shared pages divided among their users). The
    kernel walks its page tables for it: tens of ms for a GiB of small pages."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration, ValueError):
        return 0  # gone meanwhile


def socket_count() -> int:
    """The sockets of the sandbox's own network namespace, of every family. The kernel counts them
    per namespace (/proc/net/sockstat), so this costs no walk of its socket tables (reading
    /proc/net/tcp walks the whole host's: ~9 ms on the machine of docs/benchmarks.md)."""
    with open("/proc/net/sockstat") as f:
        return next(int(line.split()[2]) for line in f if line.startswith("sockets:"))


def socket_buffer_kb() -> int:
    """The most a socket's buffers can hold: twice the largest size a process may ask for. Asked of
    a socket, which the kernel caps at net.core.wmem_max and rmem_max: a network namespace of our
    own does not show those sysctls on older kernels (Linux 6.1, Debian 12's)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            s.setsockopt(socket.SOL_SOCKET, option, 1 << 30)
        return max(s.getsockopt(socket.SOL_SOCKET, o) for o in (socket.SO_SNDBUF, socket.SO_RCVBUF)) // 1024


class MemoryWatch:
    def __init__(self, limits: Limits, cgroup: dict[str, int] | None, owns_pid_namespace: bool):
        self.limit_kb = limits.memory_mb * 1024
        self.cgroup = cgroup
        # Without a cgroup, in a sandbox of our own, nothing but our looks bounds its memory.
        self.looks = not cgroup and owns_pid_namespace
        self.next_check = 0.0  # when `over` looks next (without a cgroup)
        self.walked = None  # ({process: faults}, their PSS sum in kB) when it was last summed
        self.oom_kills = cgroups.oom_kills(cgroup) if cgroup else 0
        # Without a cgroup, socket buffers are in no process's PSS: each socket counts as full.
        self.socket_kb = socket_buffer_kb() if self.looks else 0

    def until_look(self) -> float:
        """How long a wait may last before it must call `over`."""
        if not self.looks:
            return MEMORY_POLL  # the cgroup's OOM kill count, or nothing to look at: a steady pace
        return max(0.0, self.next_check - time.monotonic())

    def over(self, now: bool = False) -> bool:
        """Whether the model's processes went past the memory limit. With a cgroup, whether the
        kernel killed one at it since the last look. Otherwise we look when the last look said to
        (`now`: at once), at the sum of the processes' PSS (shared pages counted once) and the most
        their sockets' buffers can hold."""
        if self.cgroup:
            kills = cgroups.oom_kills(self.cgroup)
            over, self.oom_kills = kills > self.oom_kills, kills
            return over
        start = time.monotonic()
        if not self.looks or (start < self.next_check and not now):
            return False
        sockets_kb = self.socket_kb * socket_count()
        used_kb = sockets_kb + self.pss_bound(self.limit_kb - sockets_kb)
        end = time.monotonic()
        # At most half our time goes to looking: the model's processes, below us in their autogroup
        # (Supervisor.enter_model_side), would otherwise barely run while their sandbox is near its limit.
        self.next_check = end + max(next_look(self.limit_kb - used_kb), end - start)
        return used_kb > self.limit_kb

    def pss_bound(self, room_kb: int) -> int:
        """At least the PSS sum of the model's processes, in kB, and the sum itself when it may be
        over `room_kb`. The sum walks every page table (up to tens of ms), so it is taken again only
        then; till then the last sum and FAULT_KB per page fault since bound it, as no page comes
        in without a fault, and no fault brings more (the model's processes have no huge pages,
        isolation.py; a fork adds none). The walk stops once the sum is past `room_kb`."""
        faults = {p: n for p, n in live_processes().items() if p[0] != os.getpid()}
        if self.walked is not None:
            before, walked_kb = self.walked
            bound = walked_kb + FAULT_KB * sum(max(0, n - before.get(p, 0)) for p, n in faults.items())
            if bound <= room_kb:
                return bound
        total = 0
        for pid, _ in faults:
            total += pss_kb(pid)
            if total > room_kb:
                self.walked = None  # a part of the sum: the next look walks again
                return total
        self.walked = (faults, total)
        return total
