"""The program every sandbox runs: imports torch once and warms it up, then becomes either the
local fork server or a container's supervisor. Started by the host as

    python -S -P -m ptenv.inside.main forkserver <control fds> <cgroup dir fds> root|rootless <allowlist base>
    python -S -P -m ptenv.inside.main serve <socket path>                                                (Prime)

(local: JSON {"main": fd, "trial": fd}, JSON {controller: fd}, and the trial zygote's allowlist as
JSON, null for no zygote)
"""

import ast
import gc
import json
import os
import site
import socket
import sys
import traceback

import torch

from ptenv.inside import allowlist, codec, graph, supervisor
from ptenv.inside.forkserver import ForkServer
from ptenv.inside.namespace import new_namespace
from ptenv.inside.protocol import Limits

USAGE = ("usage: python -m ptenv.inside.main forkserver <control fds> <cgroup fds> root|rootless <allowlist base> "
         "| serve <socket path>")


def warm_up() -> None:
    """Run once what every interpreter runs, so forks start warm."""
    # A forked child of a parent that ran a multi-threaded op hangs in its next parallel op.
    torch.set_num_threads(1)
    x = torch.ones(4, 4)
    repr(codec.decode(codec.encode(x @ x)))  # printing a tensor imports a few modules lazily
    layer = torch.nn.Linear(4, 2)
    layer(x).sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    namespace = new_namespace({"x": x})
    exec(compile("y = x + 1", "<warm-up>", "exec"), namespace)
    traceback.format_exception(ValueError("warm-up"))
    ast.parse("x")
    site.setquit()  # `exit()` in a cell behaves as in a normal interpreter (we start with -S)


def serve_forks(control_fds: dict[str, int], cgroup_dirs: dict[str, int], rootless: bool,
                allowlist_base: list[str] | None) -> None:
    warm_up()
    gc.freeze()  # keep the collector from touching (and so copying) the parent's objects
    zygote = start_trial_zygote(control_fds, cgroup_dirs, rootless, allowlist_base) if "trial" in control_fds else None
    server = ForkServer(socket.socket(fileno=control_fds["main"]), cgroup_dirs, rootless, zygote=zygote)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 2)  # the host reads our stderr only while we start
    server.serve()


def start_trial_zygote(control_fds: dict[str, int], cgroup_dirs: dict[str, int], rootless: bool,
                       allowlist_base: list[str]) -> int:
    """Fork the trial zygote: a second fork server that installs the widest allowlist once, so a
    level-2 trial's sandbox, forked from it, has only its family's few removals left to make (the
    install costs a process tens of ms, mostly in pages copied on write). Its sandboxes start no
    session. Returns its pid; it exits with the host's control socket, as the fork server does."""
    pid = os.fork()
    if pid == 0:
        try:
            os.close(control_fds["main"])
            graph.warm_up()  # before the install: the tracer's first use imports what a caller could not
            allowlist.install(set(allowlist_base))
            gc.freeze()  # past the install's objects too
            # Other libraries' code stays executable here (numpy's runs at every fork); callers remove it.
            os.dup2(os.open("/dev/null", os.O_RDWR), 2)  # the host read our stderr only while we started
            ForkServer(socket.socket(fileno=control_fds["trial"]), cgroup_dirs, rootless, session=False).serve()
        finally:
            os._exit(0)
    os.close(control_fds["trial"])
    return pid


def serve(socket_path: str) -> None:
    warm_up()
    graph.warm_up()  # on Prime the callers fork from this supervisor
    # The host's limits (ptenv.host.prime.sandbox_request): it reads the replies by the same ones.
    supervisor.serve(socket_path, Limits(**json.loads(os.environ["PTENV_LIMITS"])))


if __name__ == "__main__":
    if sys.argv[1:2] == ["forkserver"] and len(sys.argv) == 6 and sys.argv[4] in ("root", "rootless"):
        serve_forks(json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4] == "rootless", json.loads(sys.argv[5]))
    elif sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    else:
        sys.exit(USAGE)
