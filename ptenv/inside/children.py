"""Reaping children without waiting: the fork server, the supervisor and the interpreter all do it,
and none of them may block on a child the model controls."""

import os


def exited_children():
    """Reap every child that has exited, without waiting; yields (pid, wait status)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status
