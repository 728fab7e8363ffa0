"""The fork server: imports torch once, then forks one supervisor per sandbox on the host's request.

    bwrap -> fork server (root, or rootless uid 0 of a user namespace; imports torch once)
               -> supervisor (PID 1 of its own pid/mount/net/ipc/uts namespaces; serves the host's requests)
                    -> interpreter   (runs the model's cells; the model's identity, isolation.py)
                    -> /bin/sh   (one per bash command; the model's identity)

Every control message carries the host's request id, and the reply echoes it. The server never
blocks on a child: a kill is answered at once, and dead supervisors are reaped (and their cgroups
freed for the next sandbox) as they go, by the same loop that serves the host.
"""

import json
import os
import signal
import socket

from ptenv.inside import cgroups
from ptenv.inside.children import exited_children
from ptenv.inside.isolation import isolate_supervisor
from ptenv.inside.protocol import Limits, readable, send_frame
from ptenv.inside.supervisor import Supervisor
from ptenv.inside.syscalls import CLONE_NEWPID, check, libc

REAP_EVERY = 0.2  # seconds between looks for dead supervisors while no request comes


class ForkServer:
    def __init__(self, control: socket.socket, cgroup_dirs: dict[str, int], rootless: bool,
                 session: bool = True, zygote: int | None = None):
        self.control = control
        self.session = session  # whether its sandboxes start a session: the trial zygote's do not
        self.zygote = zygote  # the trial zygote's pid (main.py): when it dies, so does this server
        self.cgroup_dirs = cgroup_dirs  # controller -> directory fd of this client's cgroup; {} for none
        self.rootless = rootless  # then a sandbox's two uids only name it: isolation.py gives it identities
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
        self.live: dict[int, int] = {}  # supervisor pid -> its uid
        self.exiting: set[str] = set()  # cgroups of dead sandboxes whose last process is still exiting
        self.free: list[str] = []  # empty cgroups of dead sandboxes, for new ones
        self.names: dict[int, str] = {}  # sandbox uid -> its cgroup

    def serve(self) -> None:
        self.control.send(json.dumps({"ready": True}).encode())
        while True:
            ready = readable([self.control], REAP_EVERY)
            self.reap()
            if not ready:
                continue
            msg, fds, _, _ = socket.recv_fds(self.control, 65536, 1)
            if not msg:  # the host is gone: take every sandbox with us
                self.kill([[pid, uid] for pid, uid in self.live.items()])
                return
            request = json.loads(msg)
            if request["op"] == "spawn":
                reply = self.spawn(fds[0], request)
            else:
                reply = self.kill(request["sandboxes"])
            for fd in fds:
                os.close(fd)
            self.control.send(json.dumps({**reply, "id": request["id"]}).encode())

    def spawn(self, channel_fd: int, request: dict) -> dict:
        """Fork the sandbox's supervisor as PID 1 of a new pid namespace; return its pid."""
        uid, model_uid = request["uids"]
        if uid in self.live.values():
            return {"error": f"uid {uid} still belongs to a sandbox that is exiting"}
        limits = Limits(**request["limits"])
        try:
            cgroup = cgroups.make_sandbox(self.cgroup_dirs, self.cgroup_name(uid), limits) if self.cgroup_dirs else None
            check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            pid = os.fork()
        except OSError as e:
            if uid in self.names:
                self.free.append(self.names.pop(uid))
            return {"error": f"cannot create the sandbox: {e}"}
        if pid == 0:
            os.close(self.control.detach())
            try:
                start_sandbox(channel_fd, limits, None if self.rootless else (uid, model_uid), cgroup, self.session)
            finally:
                os._exit(0)
        # Children forked later must land in our own pid namespace again, not in the new one.
        check(libc.setns(self.own_pid_ns, CLONE_NEWPID), "setns(pid)")
        for fd in (cgroup or {}).values():
            os.close(fd)
        self.live[pid] = uid
        return {"pid": pid}

    def kill(self, sandboxes: list[list[int]]) -> dict:
        """SIGKILL each supervisor: its whole pid namespace dies with it. Reaped later, not waited for."""
        for pid, uid in sandboxes:
            if self.live.get(pid) == uid:
                os.kill(pid, signal.SIGKILL)
        return {"ok": True}

    def reap(self) -> None:
        for pid, _ in exited_children():
            if pid == self.zygote:
                os._exit(1)  # the host sees its control socket close and starts a fresh fork server
            uid = self.live.pop(pid, None)
            if uid is not None and self.cgroup_dirs:
                self.exiting.add(self.names.pop(uid))
        empty = {name for name in self.exiting if cgroups.is_empty(self.cgroup_dirs, name)}
        self.free += empty
        self.exiting -= empty

    def cgroup_name(self, uid: int) -> str:
        self.names[uid] = self.free.pop() if self.free else f"sandbox-{uid}"
        return self.names[uid]


def start_sandbox(channel_fd: int, limits: Limits, uids: tuple[int, int] | None, cgroup: dict[str, int] | None,
                  session: bool) -> None:
    """In the freshly forked PID 1 of a local sandbox: isolate, then serve the host's channel."""
    channel = socket.socket(fileno=channel_fd)
    try:
        if cgroup:
            cgroups.charge_cpu(cgroup)
        keep = {channel.fileno(), *(cgroup or {}).values()}
        model = isolate_supervisor(limits, uids, keep, cgroup=cgroup is not None)
        supervisor = Supervisor(channel, limits, model, cgroup, session=session)
    except BaseException as e:
        send_frame(channel, json.dumps({"error": f"cannot isolate the sandbox: {e}"}).encode())
        raise
    send_frame(channel, json.dumps({"ready": True}).encode())
    supervisor.serve()
