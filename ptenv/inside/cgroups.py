"""Per-sandbox cgroups: limits the kernel itself enforces on the model's processes together.

    memory  all their memory, shared memory, memfd and the scratch tmpfs included (one OOM kill
            inside the sandbox at the limit, nothing outside it)
    pids    how many processes they may run at once
    cpu     one equal share each: a sandbox that runs many threads slows only itself

cgroup v1 (memory, pids and cpu hierarchies) is used where it is mounted and the host may write
under its own cgroup: as root, or as a user the cgroup is delegated to (its directories chowned to
the user). The host makes one directory per client under its own cgroup in each hierarchy and hands the fork
server a directory fd of each, so nothing of /sys is mounted into a sandbox; the fork server makes
a child directory per sandbox and the model's processes join it before they run any model code.
The supervisor joins the sandbox's cpu cgroup only: the CPU it spends for the sandbox (relaying a
flood of output) comes out of that sandbox's share, and an OOM kill can still only hit the model's
processes.
Standard library only (the fork-server half runs in the sandbox).
"""

import os
import re

CONTROLLERS = ("memory", "pids", "cpu")
ROOT = "/sys/fs/cgroup"


class Unavailable(Exception):
    """No cgroup can be had here; says why in one line."""


# ---- host side


def unavailable() -> str | None:
    """Why this process can make no cgroups of its own (one line), or None when it can."""
    if os.path.exists(f"{ROOT}/cgroup.controllers"):
        return "this machine has cgroup v2 only, which is not supported yet"
    own = own_cgroups()
    for controller in CONTROLLERS:
        if controller not in own or not os.path.isdir(f"{ROOT}/{controller}"):
            return f"no cgroup v1 {controller} hierarchy is mounted at {ROOT}/{controller}"
        if not os.access(f"{ROOT}/{controller}{own[controller]}", os.W_OK):
            return "this user may not make cgroups under its own: none is delegated to it"
    return None


def make_client_dirs(name: str) -> dict[str, str]:
    """A directory `name` under this process's own cgroup in each v1 hierarchy."""
    reason = unavailable()
    if reason:
        raise Unavailable(reason)
    own = own_cgroups()
    paths = {}
    try:
        for controller in CONTROLLERS:
            parent = f"{ROOT}/{controller}{own[controller]}".rstrip("/")
            remove_stale(parent)
            os.mkdir(f"{parent}/{name}", 0o700)
            paths[controller] = f"{parent}/{name}"
    except OSError as e:
        remove_client_dirs(paths)
        raise Unavailable(f"cannot make a cgroup: {e}") from None
    return paths


def own_cgroups() -> dict[str, str]:
    """controller -> this process's cgroup path in that v1 hierarchy, from /proc/self/cgroup."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    return own


def remove_stale(parent: str) -> None:
    """Directories left by clients that were killed before they could remove them (empty by then)."""
    for entry in os.listdir(parent):
        match = re.fullmatch(r"ptenv-(\d+)-[0-9a-f]+", entry)
        if match and not os.path.exists(f"/proc/{match[1]}"):
            remove_tree(f"{parent}/{entry}")


def remove_client_dirs(paths: dict[str, str]) -> None:
    for path in paths.values():
        remove_tree(path)


def remove_tree(path: str) -> None:
    """rmdir a client directory and its sandboxes' directories; one still in use stays."""
    try:
        for entry in os.listdir(path):
            if os.path.isdir(f"{path}/{entry}"):
                try:
                    os.rmdir(f"{path}/{entry}")
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass


# ---- fork-server side, on directory fds


def make_sandbox(dir_fds: dict[str, int], name: str, limits) -> dict[str, int]:
    """Make the sandbox's cgroup, or take over an empty one a dead sandbox left (removing a cpu
    cgroup costs the kernel more CPU than a whole rollout), with room for its processes' memory and
    its two tmpfs; returns controller -> fd of its cgroup.procs (a process joins by writing its own
    pid there) and "oom" -> fd of memory.oom_control (it counts OOM kills)."""
    for fd in dir_fds.values():
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
    memory_mb = limits.memory_mb + limits.scratch_mb + limits.shm_mb
    write(dir_fds["memory"], f"{name}/memory.limit_in_bytes", str(memory_mb << 20))
    write(dir_fds["pids"], f"{name}/pids.max", str(limits.processes))
    write(dir_fds["cpu"], f"{name}/cpu.shares", "1024")
    fds = {c: os.open(f"{name}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd) for c, fd in dir_fds.items()}
    fds["oom"] = os.open(f"{name}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fds["memory"])
    return fds


def is_empty(dir_fds: dict[str, int], name: str) -> bool:
    """Whether every process of a sandbox's cgroup has exited (its processes join all of them)."""
    fd = os.open(f"{name}/cgroup.procs", os.O_RDONLY, dir_fd=dir_fds["pids"])
    try:
        return os.read(fd, 64) == b""
    finally:
        os.close(fd)


def write(dir_fd: int, path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


# ---- in the sandbox


def charge_cpu(fds: dict[str, int]) -> None:
    """Move this process (the supervisor) into the sandbox's cpu cgroup only."""
    os.write(fds["cpu"], str(os.getpid()).encode())


def join(fds: dict[str, int]) -> None:
    """Move this process into the sandbox's cgroup (inherited by everything it starts)."""
    pid = str(os.getpid()).encode()
    for controller in CONTROLLERS:
        os.write(fds[controller], pid)


def oom_kills(fds: dict[str, int]) -> int:
    """How many processes the kernel has killed at the sandbox's memory limit."""
    text = os.pread(fds["oom"], 4096, 0).decode()
    match = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(match[1]) if match else 0
