"""How a local sandbox is walled in, in two steps with a trust boundary between them.

The supervisor (PID 1 of the sandbox, the harness) runs as its own uid with just the capabilities
it needs to manage the model's processes; the model's processes (the session and every shell) run
as a second uid with none. So the model cannot signal, renice, ptrace or prlimit the supervisor,
and the supervisor never enters a directory the model owns.
"""

import os
import resource
import signal

from ptenv.sandbox import seccomp
from ptenv.sandbox.protocol import Limits
from ptenv.sandbox.syscalls import (
    CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUTS,
    MS_NOEXEC, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS,
    check, libc, set_capabilities,
)

# Kill and wait for the model's processes, start them as the model's uid, read their memory use.
SUPERVISOR_CAPS = (CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE)
# Signals that would end PID 1 if it kept Python's handlers (SIGINT raises KeyboardInterrupt).
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SCRATCH = "/tmp"


def isolate_supervisor(limits: Limits, supervisor_uid: int, model_uid: int, keep_fds: set[int], cgroup: bool) -> None:
    """In the freshly forked PID 1: own namespaces, scratch and ptys, rlimits, then drop to the
    supervisor's uid and install the seccomp filter that every sandbox process inherits."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    for path, mb in ((b"/tmp", limits.scratch_mb), (b"/dev/shm", limits.shm_mb)):
        opts = f"size={mb}m,mode=0700,uid={model_uid},gid={model_uid}".encode()
        check(libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"mount {path}")
    # Its own pty instance with a small maximum: the host-wide pty budget is not the model's to use up.
    opts = f"newinstance,ptmxmode=0666,mode=0620,max={limits.ptys}".encode()
    check(libc.mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, opts), "mount /dev/pts")
    check(libc.sethostname(b"sandbox", 7), "sethostname")
    close_fds_except(keep_fds)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    set_rlimits(limits)
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    os.chdir("/")
    check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "prctl(KEEPCAPS)")
    os.setgroups([])
    os.setresgid(supervisor_uid, supervisor_uid, supervisor_uid)
    os.setresuid(supervisor_uid, supervisor_uid, supervisor_uid)
    set_capabilities(SUPERVISOR_CAPS)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    # Without a memory cgroup nothing could count memfd or SysV shared memory: deny them.
    seccomp.install(deny_uncounted_memory=not cgroup)


def set_rlimits(limits: Limits) -> None:
    # The address space already holds torch (copy-on-write from the fork server).
    with open("/proc/self/status") as f:
        vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    values = {
        resource.RLIMIT_AS: vm_kb * 1024 + limits.memory_mb * 1024 * 1024,
        resource.RLIMIT_NPROC: limits.processes,  # per uid, and the model's uid is its own
        resource.RLIMIT_FSIZE: limits.file_mb * 1024 * 1024,
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in values.items():
        resource.setrlimit(which, (value, value))


def become_model(model_uid: int) -> None:
    """In a child of the supervisor, before any model code: the model's uid, no capabilities."""
    os.setgroups([])
    os.setresgid(model_uid, model_uid, model_uid)
    os.setresuid(model_uid, model_uid, model_uid)
    set_capabilities(())  # the uid change kept them (neither uid is 0); exec would not bring them back
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
