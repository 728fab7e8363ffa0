"""The model's processes as the supervisor holds them: the interpreter, and a trial's callers."""

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
