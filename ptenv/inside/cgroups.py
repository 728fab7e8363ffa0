"""Per-sandbox cgroups: limits the kernel itself enforces on the model's processes together.

    memory  all their memory, shared memory, memfd and the scratch tmpfs included (one OOM kill
            inside the sandbox at the limit, nothing outside it); no swap
    pids    how many processes they may run at once
    cpu     one equal share each: a sandbox that runs many threads slows only itself

The host makes one directory per client under its own cgroup and hands the fork server a directory
fd of it, so nothing of /sys is mounted into a sandbox; the fork server makes a cgroup per sandbox
there, and the model's processes join it before they run any model code. Either hierarchy works,
where the host may write under its own cgroup: as root, or as a user it is delegated to.

cgroup v1 (memory, pids and cpu hierarchies mounted apart): one client directory per hierarchy.
The supervisor joins the sandbox's cpu cgroup only: the CPU it spends for the sandbox (relaying a
flood of output) comes out of that sandbox's share, and an OOM kill can still only hit the model's
processes.

cgroup v2 (one unified hierarchy, what current distributions mount): a process may only be in a
leaf once its parent hands controllers down ("no internal processes"), so each sandbox is a parent
with two leaves:

    <own cgroup>/ptenv-<pid>-<id>/sandbox-<uid>/   cpu.weight: the sandbox's equal CPU share
                                      supervisor/  the supervisor: its CPU is the sandbox's, its
                                                   memory and processes are not
                                      model/       memory.max, memory.swap.max 0, pids.max; the
                                                   OOM count in memory.events
Standard library only (the fork-server half runs in the sandbox).
"""

import errno
import os
import re

CONTROLLERS = ("memory", "pids", "cpu")
ROOT = "/sys/fs/cgroup"
# v2: where the host's own processes go so that their cgroup may hand controllers down.
HOST_LEAF = "ptenv-host"
CPU_WEIGHT = {"cpu.shares": "1024", "cpu.weight": "100"}  # each sandbox alike (v1, v2)


class Unavailable(Exception):
    """No cgroup can be had here; says why in one line."""


# ---- host side


def unified() -> bool:
    """Whether this machine mounts cgroup v2 alone (at ROOT), as current distributions do."""
    return os.path.exists(f"{ROOT}/cgroup.controllers")


def unavailable() -> str | None:
    """Why this process can make no cgroups of its own (one line), or None when it can."""
    if unified():
        return v2_unavailable()
    own = own_cgroups()
    for controller in CONTROLLERS:
        if controller not in own or not os.path.isdir(f"{ROOT}/{controller}"):
            return f"no cgroup v1 {controller} hierarchy is mounted at {ROOT}/{controller}"
        if not os.access(f"{ROOT}/{controller}{own[controller]}", os.W_OK):
            return "this user may not make cgroups under its own: none is delegated to it"
    return None


def v2_unavailable() -> str | None:
    own = own_v2()
    scope = "systemd-run --scope" if os.geteuid() == 0 else "systemd-run --user --scope"
    how = f"`{scope} -p Delegate=yes COMMAND` runs COMMAND in one"
    given = read_text(f"{own}/cgroup.controllers").split()
    missing = [c for c in CONTROLLERS if c not in given]
    if missing:
        return f"cgroup v2: its cgroup {own} is not given the {' and '.join(missing)} controller{'s' * (len(missing) > 1)}; {how}"
    if os.statvfs(ROOT).f_flag & os.ST_RDONLY:
        return f"cgroup v2: {ROOT} is read-only here, as in a container by default (podman: --security-opt unmask={ROOT})"
    if not all(os.access(path, os.W_OK) for path in (own, f"{own}/cgroup.procs", f"{own}/cgroup.subtree_control")):
        return f"cgroup v2: this user may not make cgroups under its own, {own}: none is delegated to it; {how}"
    return None


def chosen() -> str:
    """The mode a client here gets when unavailable() is None, and why, for the mode line."""
    if not unified():
        return "cgroup v1 memory, pids and cpu per sandbox"
    whose = "as root" if os.geteuid() == 0 else "delegated to this user"
    return f"cgroup v2 memory, pids and cpu per sandbox, under its own cgroup {own_v2()} ({whose})"


def describe(paths: dict[str, str]) -> str:
    """What a client with these directories gets, in a few words."""
    if "unified" in paths:
        return f"cgroup v2: memory (shared memory included), pids and cpu per sandbox, under {paths['unified']}"
    return "cgroup v1: memory (shared memory included), pids and cpu per sandbox"


def make_client_dirs(name: str) -> dict[str, str]:
    """A directory `name` under this process's own cgroup: in each v1 hierarchy, or {"unified": path}."""
    reason = unavailable()
    if reason:
        raise Unavailable(reason)
    paths = {}
    try:
        if unified():
            own = own_v2()
            remove_stale(own)
            hand_down_controllers(own)
            paths["unified"] = f"{own}/{name}"
            os.mkdir(paths["unified"], 0o700)
            write_text(f"{own}/{name}/cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
            return paths
        own = own_cgroups()
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
    """controller -> this process's cgroup path in that v1 hierarchy, from /proc/self/cgroup
    (the unified hierarchy's line names no controller: its key is "")."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    return own


def own_v2() -> str:
    """This process's cgroup directory in the unified hierarchy."""
    return f"{ROOT}{own_cgroups()['']}".rstrip("/") or ROOT


def hand_down_controllers(path: str) -> None:
    """Let the children of `path` have memory, pids and cpu. v2 allows that only to a cgroup with
    no process of its own (the root cgroup aside), so this process and any other in `path` move
    to its leaf HOST_LEAF first when it has some, as a container's init does: they stay under the
    same limits."""
    if set(CONTROLLERS) <= set(read_text(f"{path}/cgroup.subtree_control").split()):
        return
    for attempt in range(3):  # a process that entered `path` meanwhile makes the write fail again
        try:
            write_text(f"{path}/cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == 2:
                raise
        os.makedirs(f"{path}/{HOST_LEAF}", 0o755, exist_ok=True)
        for pid in read_text(f"{path}/cgroup.procs").split():
            try:
                write_text(f"{path}/{HOST_LEAF}/cgroup.procs", pid)
            except ProcessLookupError:
                pass  # it exited


def remove_stale(parent: str) -> None:
    """Directories left by clients that were killed before they could remove them (empty by then)."""
    for entry in os.listdir(parent):
        match = re.fullmatch(r"ptenv-(\d+)-[0-9a-f]+", entry)
        if match and not os.path.exists(f"/proc/{match[1]}"):
            remove_tree(f"{parent}/{entry}")


def remove_client_dirs(paths: dict[str, str]) -> None:
    """Remove a client's directories; v2 first kills whatever is left in them (cgroup.kill, Linux
    5.14+), which the fork server's death takes down anyway."""
    for path in paths.values():
        if os.path.exists(f"{path}/cgroup.kill"):
            try:
                write_text(f"{path}/cgroup.kill", "1")
            except OSError:
                pass  # already gone
        remove_tree(path)


def remove_tree(path: str) -> None:
    """rmdir a client directory and its sandboxes' directories, deepest first; one still in use stays."""
    for parent, dirs, _ in os.walk(path, topdown=False):
        for entry in dirs:
            try:
                os.rmdir(f"{parent}/{entry}")
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_text(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


# ---- fork-server side, on directory fds


def make_sandbox(dir_fds: dict[str, int], name: str, limits) -> dict[str, int]:
    """Make the sandbox's cgroup, or take over an empty one a dead sandbox left (removing a cpu
    cgroup costs the kernel more CPU than a whole rollout), with room for its processes' memory and
    its two tmpfs. Returns fds: where the model's processes join (by writing their own pid), where
    the supervisor joins (charge_cpu), and "oom", where the OOM kills are counted."""
    if "unified" in dir_fds:
        return make_v2_sandbox(dir_fds["unified"], name, limits)
    for fd in dir_fds.values():
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
    write(dir_fds["memory"], f"{name}/memory.limit_in_bytes", str(sandbox_bytes(limits)))
    write(dir_fds["pids"], f"{name}/pids.max", str(limits.processes))
    write(dir_fds["cpu"], f"{name}/cpu.shares", CPU_WEIGHT["cpu.shares"])
    fds = {c: os.open(f"{name}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd) for c, fd in dir_fds.items()}
    fds["oom"] = os.open(f"{name}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fds["memory"])
    return fds


def make_v2_sandbox(dir_fd: int, name: str, limits) -> dict[str, int]:
    for path in (name, f"{name}/supervisor", f"{name}/model"):
        try:
            os.mkdir(path, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            pass
    write(dir_fd, f"{name}/cpu.weight", CPU_WEIGHT["cpu.weight"])
    # Memory and pids go down to the leaves; the cpu share stays the parent's, for both.
    write(dir_fd, f"{name}/cgroup.subtree_control", "+memory +pids")
    write(dir_fd, f"{name}/model/memory.max", str(sandbox_bytes(limits)))
    try:
        write(dir_fd, f"{name}/model/memory.swap.max", "0")
    except FileNotFoundError:
        pass  # a kernel without swap accounting: there is no swap to count
    write(dir_fd, f"{name}/model/pids.max", str(limits.processes))
    return {
        "model": os.open(f"{name}/model/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd),
        "supervisor": os.open(f"{name}/supervisor/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd),
        "oom": os.open(f"{name}/model/memory.events", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd),
    }


def sandbox_bytes(limits) -> int:
    return (limits.memory_mb + limits.scratch_mb + limits.shm_mb) << 20


def is_empty(dir_fds: dict[str, int], name: str) -> bool:
    """Whether every process of a sandbox's cgroup has exited."""
    if "unified" in dir_fds:  # the supervisor's leaf and the model's
        fd = os.open(f"{name}/cgroup.events", os.O_RDONLY, dir_fd=dir_fds["unified"])
        try:
            return b"populated 0" in os.read(fd, 4096)
        finally:
            os.close(fd)
    fd = os.open(f"{name}/cgroup.procs", os.O_RDONLY, dir_fd=dir_fds["pids"])  # its processes join all of them
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
    """Move this process (the supervisor) where the sandbox's CPU is charged, not its memory or pids."""
    os.write(fds["supervisor" if "supervisor" in fds else "cpu"], str(os.getpid()).encode())


def join(fds: dict[str, int]) -> None:
    """Move this process into the sandbox's cgroup (inherited by everything it starts)."""
    pid = str(os.getpid()).encode()
    for controller in ("model",) if "model" in fds else CONTROLLERS:
        os.write(fds[controller], pid)


def oom_kills(fds: dict[str, int]) -> int:
    """How many processes the kernel has killed at the sandbox's memory limit (the same line in
    v1's memory.oom_control and v2's memory.events)."""
    text = os.pread(fds["oom"], 4096, 0).decode()
    match = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(match[1]) if match else 0
