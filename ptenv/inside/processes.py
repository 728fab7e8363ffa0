"""The model's processes as the supervisor holds them: the interpreter, and a trial's callers; and
the processes of a uid, for a container, where the supervisor does not see only its own."""

import os
import socket
from dataclasses import dataclass


@dataclass
class ModelProcess:
    pid: int
    control: socket.socket  # the supervisor's end of its channel
    pidfd: int
    out: int | None = None  # the read ends of its stdout and stderr pipes (the interpreter's only)
    err: int | None = None
    status: int | None = None  # its wait status, once reaped

    def close(self) -> None:
        """Close the supervisor's ends: its channel, its pipes and its pidfd."""
        self.control.close()
        for fd in (self.out, self.err, self.pidfd):
            if fd is not None:
                os.close(fd)


def pids_of(uid: int) -> list[int]:
    """The live processes (zombies left out) whose real or effective uid is `uid`, as this /proc shows them."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                if is_live_process_of(f.read(), uid):
                    pids.append(int(name))
        except OSError:
            continue  # gone meanwhile
    return pids


def is_live_process_of(status: bytes, uid: int) -> bool:
    """Whether a /proc status says a live process whose real or effective uid is `uid`. Its Name line
    is the model's to choose, so only the kernel's own State and Uid lines are read."""
    lines = {}
    for line in status.split(b"\n"):
        key, _, value = line.partition(b":\t")
        lines.setdefault(key, value)  # the kernel's line comes before any that a name could forge
    uids = lines.get(b"Uid", b"").split()
    return not lines.get(b"State", b"Z").startswith(b"Z") and str(uid).encode() in uids[:2]
