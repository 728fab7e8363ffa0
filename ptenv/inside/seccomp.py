"""The seccomp filters of the sandbox's processes: short BPF rule lists, written out by hand so the
sandbox needs no libseccomp.

Every sandbox process has the sandbox filter. What it denies is kernel surface that no PyTorch task
needs and that an unprivileged process could otherwise reach: new namespaces, the keyring (whose
keys would outlive the sandbox), io_uring, perf, userfaultfd, bpf, ptrace, mounts, module
loading, and inotify and fanotify (their instances count against the uid, which rootless is
shared by every sandbox and the host process). Rootless, the model's processes share the supervisor's uid, so they get a second filter
(MODEL_RULES): the calls that act on another process by pid when the uid matches (priority,
scheduler, CPU affinity, I/O priority, resource limits) may not name PID 1, the supervisor, nor
act on every process of the uid.
"""

import ctypes
import errno
import platform

from ptenv.inside.syscalls import CLONE_NEWUSER, PR_SET_THP_DISABLE, check, libc

# Syscall numbers by machine; the filter kills a process that calls in through another ABI.
ARCHES = {
    "x86_64": (0xC000003E, {
        "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "perf_event_open": 298, "userfaultfd": 323, "bpf": 321, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "swapon": 167, "swapoff": 168, "reboot": 169,
        "acct": 163, "quotactl": 179, "syslog": 103, "personality": 135, "lookup_dcookie": 212,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "iopl": 172, "ioperm": 173,
        "modify_ldt": 154, "uselib": 134, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300,
        "clone": 56, "clone3": 435, "memfd_create": 319, "shmget": 29,
        "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
        "sched_setattr": 314, "prlimit64": 302, "ioprio_set": 251, "setsid": 112,
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
        "mmap": 9, "mprotect": 10, "pkey_mprotect": 329, "shmat": 30, "open": 2, "openat": 257, "openat2": 437,
        "prctl": 157,
    }),
    "aarch64": (0xC00000B7, {
        "unshare": 97, "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "perf_event_open": 241, "userfaultfd": 282, "bpf": 280, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
        "open_tree": 428, "mount_setattr": 442, "swapon": 224, "swapoff": 225, "reboot": 142,
        "acct": 89, "quotactl": 60, "syslog": 116, "personality": 92, "lookup_dcookie": 18,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "inotify_init1": 26, "fanotify_init": 262,
        "clone": 220, "clone3": 435, "memfd_create": 279, "shmget": 194,
        "setpriority": 140, "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
        "sched_setattr": 274, "prlimit64": 261, "ioprio_set": 30, "setsid": 157,
        "execve": 221, "execveat": 281,
        "mmap": 222, "mprotect": 226, "pkey_mprotect": 288, "shmat": 196, "openat": 56, "openat2": 437, "prctl": 167,
    }),
}
# A rule is EPERM or ENOSYS for every call, or the conditions on the call's arguments under which
# it is allowed (otherwise EPERM): (argument index, EQUALS, NOT, NONE_OF or SOME_OF (bits), value),
# on the low 32 bits.
EPERM, ENOSYS = "eperm", "enosys"
EQUALS, NOT, NONE_OF, SOME_OF = "equals", "not", "none of", "some of"
DENIED = (
    "unshare", "setns", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "perf_event_open", "userfaultfd", "bpf", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_getfd", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "mount",
    "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "mount_setattr", "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "personality", "lookup_dcookie",
    "name_to_handle_at", "open_by_handle_at", "iopl", "ioperm", "modify_ldt", "uselib",
    "inotify_init", "inotify_init1", "fanotify_init",
)
# Calls of DENIED that a machine does not have at all (nothing to deny there).
ABSENT = {"x86_64": set(), "aarch64": {"iopl", "ioperm", "modify_ldt", "uselib", "inotify_init", "fork", "vfork", "open"}}
# clone() flags that make a namespace; clone3 passes its flags in memory, which a filter cannot
# read, so it answers ENOSYS and the C library falls back to clone().
NAMESPACE_FLAGS = 0x7E020000
CLONE_THREAD = 0x00010000
# A function task's caller (caller.py), on top of the sandbox filter: no new process and no new
# program once the answer runs, so that only the process the supervisor started answers, and a
# call's time limit, enforced by killing that process, ends everything the call did. Threads may
# still start (clone with CLONE_THREAD; clone3 already answers ENOSYS).
CALLER_RULES = {"fork": EPERM, "vfork": EPERM, "execve": EPERM, "execveat": EPERM,
                "clone": ((0, SOME_OF, CLONE_THREAD),)}
# A caller under an allowlist (allowlist.py), on top: no new executable memory, mapped or made so
# (no native library loads, no code written at run time, no library's code made executable again),
# and no file opened for writing (so no /proc/self/mem to undo the allowlist's stubs). openat2
# passes its flags in memory: ENOSYS, and the C library uses openat.
PROT_EXEC, SHM_EXEC = 0x4, 0o100000
WRITE_FLAGS = 0o1 | 0o2  # O_WRONLY | O_RDWR
ALLOWLIST_RULES = {"mmap": ((2, NONE_OF, PROT_EXEC),), "mprotect": ((2, NONE_OF, PROT_EXEC),),
                   "pkey_mprotect": ((2, NONE_OF, PROT_EXEC),), "shmat": ((2, NONE_OF, SHM_EXEC),),
                   "open": ((1, NONE_OF, WRITE_FLAGS),), "openat": ((2, NONE_OF, WRITE_FLAGS),), "openat2": ENOSYS}
PRIO_USER, IOPRIO_WHO_USER = 2, 3
SUPERVISOR_PID = 1
MODEL_RULES = {
    "setns": EPERM,
    # By user: the supervisor has the model's uid. By process or group: any but PID 1's.
    "setpriority": ((0, NOT, PRIO_USER), (1, NOT, SUPERVISOR_PID)),
    "ioprio_set": ((0, NOT, IOPRIO_WHO_USER), (1, NOT, SUPERVISOR_PID)),
    **{name: ((0, NOT, SUPERVISOR_PID),) for name in (
        "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr", "prlimit64")},
}

LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARGS = 0, 4, 16
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def sandbox_rules(cgroup: bool, enter_userns: bool) -> dict:
    """The filter every sandbox process has. Without a cgroup, what only a cgroup could account for
    is denied: memfd and SysV shared memory (in no process's memory), a new session (the
    sandbox's session is its autogroup, the kernel's CPU share without a cgroup), and huge pages
    back (isolation.py turned them off: the supervisor's memory looks count on it). Rootless, the
    supervisor's children must enter the model's user namespace (MODEL_RULES then deny it)."""
    rules = {name: EPERM for name in DENIED}
    rules["clone3"] = ENOSYS
    rules["clone"] = ((0, NONE_OF, NAMESPACE_FLAGS),)
    if not cgroup:
        rules.update(memfd_create=EPERM, shmget=EPERM, setsid=EPERM, prctl=((0, NOT, PR_SET_THP_DISABLE),))
    if enter_userns:
        rules["setns"] = ((1, EQUALS, CLONE_NEWUSER),)
    return rules


def program(machine: str, rules: dict) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, k)."""
    arch, numbers = ARCHES[machine]
    prog = [(LD_W_ABS, 0, 0, OFFSET_ARCH), (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL_PROCESS), (LD_W_ABS, 0, 0, OFFSET_NR)]
    if machine == "x86_64":
        prog.append((JGE, EPERM, 0, 0x40000000))  # the x32 ABI's numbers
    for name, rule in rules.items():
        if name in ABSENT[machine]:
            continue
        if rule in (EPERM, ENOSYS):
            prog.append((JEQ, rule, 0, numbers[name]))
            continue
        # Another call skips this block with its number still loaded; this one ends in it.
        prog.append((JEQ, 0, 2 * len(rule) + 1, numbers[name]))
        for arg, test, value in rule:
            prog.append((LD_W_ABS, 0, 0, OFFSET_ARGS + 8 * arg))
            fails = {EQUALS: (JEQ, 0, EPERM), NOT: (JEQ, EPERM, 0), NONE_OF: (JSET, EPERM, 0), SOME_OF: (JSET, 0, EPERM)}[test]
            prog.append((*fails, value))
        prog.append((RET, 0, 0, RET_ALLOW))
    prog.append((RET, 0, 0, RET_ALLOW))
    labels = {EPERM: len(prog), ENOSYS: len(prog) + 1}
    prog += [(RET, 0, 0, RET_ERRNO | errno.EPERM), (RET, 0, 0, RET_ERRNO | errno.ENOSYS)]
    return [
        (code, labels[jt] - i - 1 if isinstance(jt, str) else jt, labels[jf] - i - 1 if isinstance(jf, str) else jf, k)
        for i, (code, jt, jf, k) in enumerate(prog)
    ]


def install(rules: dict) -> None:
    """Filter this process and everything it starts (needs no_new_privs set first)."""
    machine = platform.machine()
    if machine not in ARCHES:
        raise OSError(f"no seccomp filter for {machine}: known are {sorted(ARCHES)}")
    prog = program(machine, rules)
    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(SECCOMP)")
