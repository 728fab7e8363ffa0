"""The seccomp filter of every sandbox process: a short BPF deny list, written out by hand so the
sandbox needs no libseccomp. What it denies is kernel surface that no PyTorch task needs and that
an unprivileged process could otherwise reach: new namespaces, the keyring (whose keys would
outlive the sandbox), io_uring, perf, userfaultfd, bpf, ptrace, mounts and module loading."""

import ctypes
import errno
import platform

from ptenv.sandbox.syscalls import check, libc

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
        "modify_ldt": 154, "uselib": 134,
        "clone": 56, "clone3": 435, "memfd_create": 319, "shmget": 29,
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
        "name_to_handle_at": 264, "open_by_handle_at": 265,
        "clone": 220, "clone3": 435, "memfd_create": 279, "shmget": 194,
    }),
}
SPECIAL = ("clone", "clone3", "memfd_create", "shmget")  # not denied outright
# Memory that is in no process's PSS: denied where no memory cgroup can count it.
UNCOUNTED_MEMORY = ("memfd_create", "shmget")
# clone() flags that make a namespace; clone3 passes its flags in memory, which a filter cannot
# read, so it answers ENOSYS and the C library falls back to clone().
NAMESPACE_FLAGS = 0x7E020000

LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def program(machine: str, deny_uncounted_memory: bool) -> list[tuple[int, int | str, int | str, int]]:
    """The filter as (code, jump if true, jump if false, k); jumps name a label or skip a count."""
    arch, numbers = ARCHES[machine]
    denied = [nr for name, nr in numbers.items() if name not in SPECIAL]
    if deny_uncounted_memory:
        denied += [numbers[name] for name in UNCOUNTED_MEMORY]
    prog = [(LD_W_ABS, 0, 0, OFFSET_ARCH), (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL_PROCESS), (LD_W_ABS, 0, 0, OFFSET_NR)]
    if machine == "x86_64":
        prog.append((JGE, "eperm", 0, 0x40000000))  # the x32 ABI's numbers
    prog += [(JEQ, "eperm", 0, nr) for nr in denied]
    prog += [
        (JEQ, "enosys", 0, numbers["clone3"]),
        (JEQ, 0, "allow", numbers["clone"]),
        (LD_W_ABS, 0, 0, OFFSET_ARG0),
        (JSET, "eperm", 0, NAMESPACE_FLAGS),
    ]
    labels = {"allow": len(prog), "eperm": len(prog) + 1, "enosys": len(prog) + 2}
    prog += [(RET, 0, 0, RET_ALLOW), (RET, 0, 0, RET_ERRNO | errno.EPERM), (RET, 0, 0, RET_ERRNO | errno.ENOSYS)]
    return [
        (code, labels[jt] - i - 1 if isinstance(jt, str) else jt, labels[jf] - i - 1 if isinstance(jf, str) else jf, k)
        for i, (code, jt, jf, k) in enumerate(prog)
    ]


def install(deny_uncounted_memory: bool) -> None:
    """Filter this process and everything it starts (needs no_new_privs set first)."""
    machine = platform.machine()
    if machine not in ARCHES:
        raise OSError(f"no seccomp filter for {machine}: known are {sorted(ARCHES)}")
    prog = program(machine, deny_uncounted_memory)
    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(SECCOMP)")
