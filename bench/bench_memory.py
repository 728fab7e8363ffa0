"""Rootless memory bursts: how far past its memory limit a sandbox without a cgroup gets before its
supervisor's look (supervisor.over_memory) kills the burst, with the fixed 0.2 s poll of before
and with the adaptive one (supervisor.next_look), side by side in one run.

    .venv/bin/python bench/bench_memory.py --rootless-as ptenv-rootless [--rounds N]   # as root
    .venv/bin/python bench/bench_memory.py [--rounds N]                                # as an ordinary user

As root, the sandboxes run as USER (`scripts/rootless-user` makes ptenv-rootless), rootless and
without a cgroup: the mode where the supervisor polls. It prints:

- the fault rate: N processes writing fresh anonymous memory in 16 MiB blocks, each block's end
  timed; the whole burst's rate and the highest over any 50 ms, in GiB/s; as the sandbox's
  processes do it (no huge pages, isolation.py), and with huge pages asked for (madvise), which the
  sandbox denies;
- one look's cost: reading smaps_rollup of processes holding 1.8 GiB (the kernel walks their page
  tables); one process, twelve, and 63 forks sharing one process's 1.8 GiB copy-on-write;
- the burst: a `bash` command of 12 processes, each writing up to 1 GiB in 16 MiB blocks, in a
  sandbox of 2 GiB and of 512 MiB. Its peak is the interpreter's PSS before the burst plus the 12
  processes' anonymous RSS (/proc/<pid>/status, read from outside every ~2 ms; the host's
  MemAvailable, which other jobs on a shared machine move by as much, would not tell). Rounds
  alternate between supervisors (VARIANTS: a copy of ptenv/inside with a few lines appended to supervisor.py,
  mounted instead): as before next_look (a look every 0.2 s however near the limit, summing PSS
  every time, the model's processes at the supervisor's nice), the adaptive look with the model
  at nice 0, and the real one.
"""

import argparse
import asyncio
import ctypes
import mmap
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ptenv import inside  # noqa: E402
from ptenv.host.local import LocalSandboxClient  # noqa: E402
from ptenv.inside.protocol import Limits  # noqa: E402
from ptenv.inside.memory import FAULT_RATE_KB, MIN_POLL  # noqa: E402
from ptenv.inside.syscalls import PR_SET_THP_DISABLE, libc  # noqa: E402
from tests.support.sandbox import new_box  # noqa: E402

BLOCK = 16 << 20
GIB = 1 << 30
BURST = 12
HOG = ("import time\nblocks = []\ntry:\n    for _ in range(64):\n        blocks.append(b'x' * (16 << 20))\n"
       "except MemoryError:\n    pass\ntime.sleep(60)\n")
BURST_COMMAND = " & ".join([f'python3 -c "{HOG}"'] * BURST) + " & wait"


def kib_field(path: str, name: bytes) -> int:
    with open(path, "rb") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name))


# -- the fault rate and a look's cost, measured on the host

def write_blocks(blocks: int, huge: bool, go: int, out: int) -> None:
    """In a child: fresh private anonymous memory, written a block at a time; each block's end time to `out`."""
    if not huge:
        libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)  # as a sandbox without a cgroup has it
    m = mmap.mmap(-1, blocks * BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    view = (ctypes.c_char * (blocks * BLOCK)).from_buffer(m)
    os.read(go, 1)
    ends = []
    for i in range(blocks):
        ctypes.memset(ctypes.addressof(view) + i * BLOCK, 1, BLOCK)
        ends.append(time.monotonic())
    os.write(out, " ".join(map(repr, ends)).encode() + b"\n")


def fault_rate(n: int, total_mib: int, huge: bool) -> tuple[float, float]:
    """(whole burst, highest 50 ms) GiB/s of n processes writing total_mib between them."""
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    blocks = total_mib * (1 << 20) // BLOCK // n
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                write_blocks(blocks, huge, go_r, out_w)
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(out_w)
    time.sleep(0.5)  # every child has mapped its memory
    start = time.monotonic()
    os.write(go_w, b"x" * n)
    with os.fdopen(out_r) as f:
        ends = sorted(float(t) for line in f for t in line.split())
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(go_r)
    os.close(go_w)
    whole = len(ends) * BLOCK / GIB / (ends[-1] - start)
    window, best, j = 0.05, 0, 0
    for i, t in enumerate(ends):  # blocks that ended within 50 ms, at each block's end
        while ends[j] < t - window:
            j += 1
        best = max(best, i - j + 1)
    return whole, best * BLOCK / GIB / window


def look_ms(pids: list[int]) -> float:
    """The fastest of 5 reads of every process's smaps_rollup, as over_memory sums PSS."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for pid in pids:
            kib_field(f"/proc/{pid}/smaps_rollup", b"Pss:")
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


# A fresh process that holds argv[1] bytes of small pages, then forks argv[2] times; each writes its pid,
# a line in one write (print's pieces from 64 processes interleaved on the pipe: "3118131192\n\n").
HOLDER = ("import ctypes, os, sys, time\nctypes.CDLL(None).prctl(41, 1, 0, 0, 0)\nhog = b'x' * int(sys.argv[1])\n"
          "for _ in range(int(sys.argv[2])):\n    if os.fork() == 0:\n        break\nos.write(1, b'%d\\n' % os.getpid())\n"
          "time.sleep(120)\n")


def look_cost(processes: int, forks: bool) -> float:
    """A look's time over processes holding 1.8 GiB of small pages together: each its own part, or
    (forks) one process's, shared copy-on-write by all."""
    size = (1800 << 20) // (1 if forks else processes)
    holders = [subprocess.Popen([sys.executable, "-c", HOLDER, str(size), str(processes - 1 if forks else 0)],
                                stdout=subprocess.PIPE, text=True) for _ in range(1 if forks else processes)]
    pids = [int(holder.stdout.readline()) for holder in holders for _ in range(processes if forks else 1)]
    try:
        return look_ms(pids)
    finally:
        for pid in pids:
            os.kill(pid, 9)
        for holder in holders:
            holder.wait()


# -- the burst, in a rootless sandbox without a cgroup

class Peak(threading.Thread):
    """Samples the burst's processes' anonymous RSS every ~2 ms from outside; keeps the highest sum."""

    def __init__(self, box):
        super().__init__(daemon=True)
        self.box, self.done = box, threading.Event()
        self.interpreter = box.processes()[1]
        self.rss_kb = 0

    def run(self):
        pids, listed = [], 0.0
        while not self.done.wait(0.002):
            if time.monotonic() - listed > 0.02:  # the burst's processes come and go
                pids, listed = [p for p in self.box.processes()[1:] if p != self.interpreter], time.monotonic()
            total = 0
            for pid in pids:
                try:
                    total += kib_field(f"/proc/{pid}/status", b"RssAnon:")
                except (OSError, StopIteration):
                    pass
            self.rss_kb = max(self.rss_kb, total)


async def burst(client: LocalSandboxClient, memory_mb: int) -> tuple[float, bool]:
    """The peak above the limit (GiB), and whether the burst was killed."""
    box = await new_box(client)
    try:
        await box.cell("x = 1")
        base_kb = kib_field(f"/proc/{box.processes()[1]}/smaps_rollup", b"Pss:")
        with_peak = Peak(box)
        with_peak.start()
        done = await box.sh(BURST_COMMAND, timeout=60)
        with_peak.done.set()
        with_peak.join()
        killed = f"used more than its {memory_mb} MiB" in done.stderr
        return (base_kb + with_peak.rss_kb - (memory_mb << 10)) / (1 << 20), killed
    finally:
        await client.delete(box.id)


# Supervisors to compare, as lines appended to a copy of supervisor.py (None: as it is).
VARIANTS = {
    # As before next_look: a look every MEMORY_POLL that always sums PSS, the model at our nice.
    "before": "def next_look(headroom_kb):\n    return MEMORY_POLL\n\nFAULT_KB = 1 << 40\nMODEL_NICE = 0\n",
    "adaptive, nice 0": "MODEL_NICE = 0\n",
    "adaptive": None,
}


def patched_copy(root: Path, lines: str) -> Path:
    """ptenv/inside with `lines` appended to its supervisor.py, to mount instead of the real one."""
    for rel in inside.FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(inside.SOURCE_ROOT / rel, root / rel)
    with open(root / "ptenv/inside/supervisor.py", "a") as f:
        f.write("\n\n# bench_memory.py\n" + lines)
    return root


async def bursts(rounds: int) -> dict:
    results = {}
    real = inside.SOURCE_ROOT
    with tempfile.TemporaryDirectory() as tmp:
        roots = {name: patched_copy(Path(tmp, str(i)), lines) if lines else real for i, (name, lines) in enumerate(VARIANTS.items())}
        for _ in range(rounds):
            for memory_mb in (2048, 512):
                for name, root in roots.items():
                    inside.SOURCE_ROOT = root  # the files the fork server mounts at /opt/ptenv
                    client = LocalSandboxClient(Limits(memory_mb=memory_mb, cell_timeout=30))
                    try:
                        assert "no cgroup" in client.isolation_mode, client.isolation_mode
                        results.setdefault((memory_mb, name), []).append(await burst(client, memory_mb))
                    finally:
                        client.teardown()
                        inside.SOURCE_ROOT = real
    return results


def report(rounds: int) -> None:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        thp = f.read().strip()
    print(f"{os.cpu_count()} CPUs, huge pages: {thp}; FAULT_RATE_KB = {FAULT_RATE_KB / (1 << 20):.1f} GiB/s, MIN_POLL = {MIN_POLL * 1e3:.0f} ms\n")
    print("fault rate, GiB/s (whole burst / highest 50 ms), 1.5 GiB written between them:")
    for huge in (False, True):
        line = ", ".join(f"{n} process{'es' * (n > 1)} {w:.2f} / {p:.2f}" for n in (1, 2, 12) for w, p in [fault_rate(n, 1536, huge)])
        print(f"  {'huge pages (madvise)' if huge else 'small pages (as sandboxed)':28}: {line}")
    print("\none look (smaps_rollup of each process), 1.8 GiB held:")
    for processes, forks, label in ((1, False, "1 process"), (12, False, "12 processes, 150 MiB each"), (64, True, "64 processes sharing it (63 forks)")):
        print(f"  {label:36}: {look_cost(processes, forks):7.1f} ms")
    print(f"\nburst of {BURST} processes writing up to 1 GiB each, {rounds} rounds; peak above the limit in GiB:")
    results = asyncio.run(bursts(rounds))
    for (memory_mb, name), runs in results.items():
        killed = sum(r[1] for r in runs)
        print(f"  {memory_mb:4} MiB {name:16}: {fmt([r[0] for r in runs])}; killed {killed}/{len(runs)}")


def fmt(values: list[float]) -> str:
    return f"median {statistics.median(values):+.2f} (" + ", ".join(f"{v:+.2f}" for v in values) + ")"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="bursts per limit and poll")
    parser.add_argument("--rootless-as", metavar="USER", help="as root: run the sandboxes as USER, rootless")
    args = parser.parse_args()
    if os.geteuid() == 0:
        if not args.rootless_as:
            sys.exit("as root, pass --rootless-as USER (scripts/rootless-user makes ptenv-rootless): root sandboxes have cgroups")
        with tempfile.TemporaryDirectory() as home:
            os.chown(home, pwd.getpwnam(args.rootless_as).pw_uid, -1)
            argv = ["runuser", "-u", args.rootless_as, "--", "env", f"HOME={home}", sys.executable, __file__, "--rounds", str(args.rounds)]
            sys.exit(subprocess.run(argv).returncode)
    report(args.rounds)
