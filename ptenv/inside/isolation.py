"""How a local sandbox is walled in, in two steps with a trust boundary between them.

The supervisor (PID 1 of the sandbox, ours) keeps just the capabilities it needs to manage
the model's processes; the model's processes (the interpreter and every shell) run with none, as
another identity:

    root      a host uid of their own (the supervisor has another)
    rootless  the one host uid of the user, inside a user namespace of the sandbox's own; the
              supervisor is PID 1 (which ignores signals from its namespace), hidden from the
              model's /proc, and a second seccomp filter keeps the model's scheduling and limit
              calls off PID 1

So the model cannot signal, renice, ptrace or prlimit the supervisor, and the supervisor never
enters a directory the model owns.
"""

import os
import resource
import signal
from dataclasses import dataclass

from ptenv.inside import seccomp
from ptenv.inside.protocol import Limits
from ptenv.inside.syscalls import (
    CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUSER,
    CLONE_NEWUTS, MS_NOEXEC, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, PR_SET_DUMPABLE, PR_SET_KEEPCAPS,
    PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_THP_DISABLE, check, libc, set_capabilities,
)

# Kill and wait for the model's processes, start them as the model's uid, read their memory use.
SUPERVISOR_CAPS = (CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE)
# Signals that would end PID 1 if it kept Python's handlers (SIGINT raises KeyboardInterrupt).
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SCRATCH = "/tmp"
ROOTLESS_MODEL_UID = 1_000_000  # the model's uid in its user namespace (rootless)


@dataclass(frozen=True)
class ModelUser:
    """Who the model's processes become: `uid` on the host, or in the user namespace `userns` (an fd)."""
    uid: int
    userns: int | None = None


def isolate_supervisor(limits: Limits, uids: tuple[int, int] | None, keep_fds: set[int], cgroup: bool) -> ModelUser:
    """In the freshly forked PID 1: own namespaces, scratch and ptys, rlimits, then drop to the
    supervisor's identity and install the seccomp filter that every sandbox process inherits.
    `uids` are the supervisor's and the model's host uids (root), or None (rootless: we are uid 0
    of the user namespace the fork server runs in, the user's one uid)."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # The model sees only processes it may ptrace: not its supervisor (which is not dumpable).
    check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=invisible"), "mount /proc")
    # Made before our rlimits apply: above the sandbox, its process count is held to the host's limit.
    model = ModelUser(uids[1]) if uids else ModelUser(ROOTLESS_MODEL_UID, model_user_namespace())
    owner = uids[1] if uids else 0
    for path, mb in ((b"/tmp", limits.scratch_mb), (b"/dev/shm", limits.shm_mb)):
        opts = f"size={mb}m,mode=0700,uid={owner},gid={owner}".encode()
        check(libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"mount {path}")
    # Its own pty instance with a small maximum: the host-wide pty budget is not the model's to use up.
    opts = f"newinstance,ptmxmode=0666,mode=0620,max={limits.ptys}".encode()
    check(libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, opts), "mount /dev/pts")
    check(libc.sethostname(b"sandbox", 7), "sethostname")
    close_fds_except(keep_fds | {model.userns} - {None})
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    set_rlimits(limits)
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    os.chdir("/")
    # A session of the sandbox's own, which without a cgroup the model may not leave (seccomp.py):
    # the kernel's autogroups then share the CPU by sandbox.
    os.setsid()
    if uids:
        check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(KEEPCAPS)")
        os.setgroups([])
        os.setresgid(uids[0], uids[0], uids[0])
        os.setresuid(uids[0], uids[0], uids[0])
    set_capabilities(SUPERVISOR_CAPS)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    # Die with the fork server (and, PID 1, take the sandbox along), whatever else still holds the
    # channel. Set after the uid change, which clears it; a fork server that died before this line
    # leaves us to the channel, which the host closes when it notices (or when it dies).
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if not cgroup:
        # No huge pages for the sandbox's processes (inherited through fork and exec; seccomp.py
        # keeps the model from undoing it): a fault then brings in at most 64 KiB, and the model
        # faults memory in at 4 KiB pages' pace, which the supervisor's memory looks are paced for.
        check(libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0), "prctl(THP_DISABLE)")
    seccomp.install(seccomp.sandbox_rules(cgroup=cgroup, enter_userns=not uids))
    return model


def model_user_namespace() -> int:
    """A user namespace for the model's processes, owned by us, mapping ROOTLESS_MODEL_UID in it to
    our uid; returns an fd of it. In a namespace of its own, the model's process count is its own."""
    pid = os.fork()
    if pid == 0:
        try:
            check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
            os.kill(os.getpid(), signal.SIGSTOP)
        finally:
            os._exit(1)
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            raise OSError("cannot make the model's user namespace")
        fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"{ROOTLESS_MODEL_UID} 0 1")
        return fd
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def set_rlimits(limits: Limits) -> None:
    # The address space already holds torch (copy-on-write from the fork server).
    with open("/proc/self/status") as f:
        vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    values = {
        resource.RLIMIT_AS: vm_kb * 1024 + limits.memory_mb * 1024 * 1024,
        resource.RLIMIT_FSIZE: limits.file_mb * 1024 * 1024,
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in values.items():
        resource.setrlimit(which, (value, value))


def become_model(model: ModelUser, limits: Limits) -> None:
    """In a child of the supervisor, before any model code: the model's identity and process
    budget, no capabilities."""
    # Set before the uid changes, so it counts the model's processes only (the supervisor's uid,
    # rootless the namespace above, keeps the host's budget).
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    if model.userns is None:
        os.setgroups([])
    else:  # joining the namespace grants every capability in it, which set_capabilities drops
        check(libc.setns(model.userns, CLONE_NEWUSER), "setns(user)")
        seccomp.install(seccomp.MODEL_RULES)
    os.setresgid(model.uid, model.uid, model.uid)
    os.setresuid(model.uid, model.uid, model.uid)
    set_capabilities(())  # kept through the uid change; exec would not bring them back
    # The model's own processes are visible to it (hidepid) and their /proc files are its own.
    check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def close_fds_except(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the fd of the listdir itself
