"""Which processes a run started, and which of them still live: the leftover checks of the fault
tests and the soak, and a local sandbox's processes as host pids (tests, bench_sandbox). A process is named by (pid, start time), so a reused pid is not mistaken for it.
"""

import os


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def cpu(pid: int | None) -> float:
    """A process's CPU and that of the children it reaped (utime + stime + cutime + cstime), in
    seconds; 0 for one gone (its parent, if counted, has it in its cutime and cstime) or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree(roots: list[int]) -> dict[int, int]:
    """The roots and all their descendants, as {pid: start time}."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        stat = _stat(int(name))
        if stat:
            children.setdefault(stat[1], []).append(int(name))
    found, todo = {}, list(roots)
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat and pid not in found:
            found[pid] = stat[2]
            todo += children.get(pid, [])
    return found


def forkserver_bwraps(root: int) -> dict[int, int]:
    """The bwrap processes under `root` that run a sandbox fork server, as {pid: parent pid}."""
    found = {}
    for pid in tree([root]):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        stat = _stat(pid)
        if stat and b"bwrap" in cmdline.split(b"\0")[0] and b"forkserver" in cmdline:
            found[pid] = stat[1]
    return found


def survivors(snapshot: dict[int, int]) -> list[int]:
    """The processes of a snapshot that still run (a zombie has ended)."""
    alive = []
    for pid, start in snapshot.items():
        stat = _stat(pid)
        if stat and stat[2] == start and stat[0] != "Z":
            alive.append(pid)
    return alive


def holding(name: str) -> list[int]:
    """Processes whose /tmp holds `name`: the sandboxes (and so the private scratch dirs) still alive."""
    return [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if os.path.exists(f"/proc/{p}/root/tmp/{name}")]


def supervisor(pid: int) -> int | None:
    """The supervisor of the sandbox `pid` runs in: the process of the same mount namespace that is
    PID 1 of its own pid namespace."""
    try:
        mount_ns = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{name}/ns/mnt") != mount_ns:
                continue
            with open(f"/proc/{name}/status") as f:
                nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if nspid[-1] == "1" and len(nspid) > 1:
            return int(name)
    return None


def nspids(pid: int) -> list[str]:
    """The pid of a process in each pid namespace it is in, outermost first ([] once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
    except OSError:
        return []


def supervisor_of(client, sandbox_id: str) -> tuple[int, int]:
    """(host pid, start time) of a sandbox's supervisor: the fork server's child that the fork
    server knows by the sandbox's pid. Read from /proc/*/status and stat, which any user may read
    (rootless, every sandbox process has the host user's uid)."""
    fork_server_pid = str(client._boxes[sandbox_id].pid)
    for pid, start in tree([client.pool.forkserver.pid]).items():
        if nspids(pid)[1:] == [fork_server_pid, "1"]:
            return pid, start
    raise LookupError(f"no supervisor for {sandbox_id}")


def sandbox_processes(supervisor: tuple[int, int]) -> list[int]:
    """A sandbox's live (non-zombie) processes: its supervisor and what runs under it."""
    if not survivors(dict([supervisor])):
        return []  # everything else in its pid namespace died with it
    others = survivors(tree([supervisor[0]]))
    return [supervisor[0]] + [pid for pid in others if pid != supervisor[0]]
