"""The Linux calls Python's os module does not wrap, through ctypes: namespaces, mounts, prctl and
capabilities. Standard library only (mounted into the sandbox)."""

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_SET_NO_NEW_PRIVS = 38
PR_SET_THP_DISABLE = 41
CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE = 5, 6, 7, 19
_CAPABILITY_VERSION_3 = 0x20080522

libc = ctypes.CDLL(None, use_errno=True)


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def set_capabilities(caps: tuple[int, ...]) -> None:
    """Make `caps` this process's only effective and permitted capabilities (all below 32)."""
    mask = sum(1 << cap for cap in caps)
    data = (_CapData * 2)(_CapData(mask, mask, 0), _CapData(0, 0, 0))
    check(libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data), "capset")


def has_capabilities(*caps: int) -> bool:
    """Whether this process may use each of `caps` (its effective set)."""
    with open("/proc/self/status") as f:
        effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return all(effective >> cap & 1 for cap in caps)
