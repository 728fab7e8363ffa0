"""The cgroup v2 path of ptenv/inside/cgroups.py on a fake unified hierarchy (plain directories
and files standing in for the kernel's), so that it runs on a cgroup v1 machine too. The kernel's
side of it (limits enforced, the OOM count, the supervisor outside the model's cgroup) is
tests/test_kernel_limits.py, on whichever hierarchy the machine has: v1 in CI, v2 in
scripts/test-guest."""

import os

import pytest

from ptenv.inside import cgroups
from ptenv.inside.protocol import Limits

LIMITS = Limits(memory_mb=512)
OWN = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-1.scope"


@pytest.fixture
def v2(tmp_path, monkeypatch):
    """A unified hierarchy at tmp_path whose own cgroup (OWN) has the three controllers."""
    monkeypatch.setattr(cgroups, "ROOT", str(tmp_path))
    monkeypatch.setattr(cgroups, "own_cgroups", lambda: {"": OWN})
    own = tmp_path / OWN.lstrip("/")
    own.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        (own / name).write_text("")
    return own


def kernel_files(sandbox) -> None:
    """The files the kernel makes with a sandbox's cgroups (mkdir makes them there)."""
    for leaf in ("", "supervisor", "model"):
        (sandbox / leaf).mkdir(parents=True, exist_ok=True)
        for name in ("cgroup.procs", "cgroup.subtree_control", "cpu.weight", "cgroup.events"):
            (sandbox / leaf / name).write_text("")
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        (sandbox / "model" / name).write_text("")
    (sandbox / "model" / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n")


def test_a_unified_hierarchy_is_v2_and_its_mode_line_names_the_cgroup(v2):
    assert cgroups.unified() and cgroups.own_v2() == str(v2)
    assert cgroups.unavailable() is None
    whose = "as root" if os.geteuid() == 0 else "delegated to this user"
    assert cgroups.chosen() == f"cgroup v2 memory, pids and cpu per sandbox, under its own cgroup {v2} ({whose})"


def test_a_cgroup_not_given_the_controllers_is_named_with_the_command_that_delegates_one(v2):
    (v2 / "cgroup.controllers").write_text("memory\n")
    reason = cgroups.unavailable()
    assert reason.startswith(f"cgroup v2: its cgroup {v2} is not given the pids and cpu controllers;"), reason
    assert "-p Delegate=yes COMMAND" in reason
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    assert "is not given the pids controller;" in cgroups.unavailable()


def test_a_cgroup_not_delegated_to_this_user_is_said_so(v2, monkeypatch):
    # As a user whose cgroup's files are not its own (root could write them anyway).
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).endswith("cgroup.procs"))
    reason = cgroups.unavailable()
    assert reason == (f"cgroup v2: this user may not make cgroups under its own, {v2}: none is delegated to it; "
                      "`systemd-run --user --scope -p Delegate=yes COMMAND` runs COMMAND in one"), reason


def test_the_client_directory_hands_the_three_controllers_down(v2):
    paths = cgroups.make_client_dirs("ptenv-1-abc")
    assert paths == {"unified": f"{v2}/ptenv-1-abc"}
    assert (v2 / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (v2 / "ptenv-1-abc" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert cgroups.describe(paths).startswith("cgroup v2: memory (shared memory included), pids and cpu per sandbox")
    assert cgroups.describe({c: "/x" for c in cgroups.CONTROLLERS}).startswith("cgroup v1")
    cgroups.remove_client_dirs(paths)  # no cgroup.kill here (before Linux 5.14): rmdir alone


def test_a_sandbox_is_a_parent_with_the_cpu_share_and_two_leaves_only_the_models_limited(v2, tmp_path):
    client = tmp_path / "client"
    kernel_files(client / "sandbox-7")
    dir_fd = os.open(client, os.O_RDONLY | os.O_DIRECTORY)
    fds = cgroups.make_sandbox({"unified": dir_fd}, "sandbox-7", LIMITS)
    try:
        sandbox = client / "sandbox-7"
        assert (sandbox / "cpu.weight").read_text() == "100"
        assert (sandbox / "cgroup.subtree_control").read_text() == "+memory +pids"
        assert (sandbox / "model" / "memory.max").read_text() == str((512 + LIMITS.scratch_mb + LIMITS.shm_mb) << 20)
        assert (sandbox / "model" / "memory.swap.max").read_text() == "0"
        assert (sandbox / "model" / "pids.max").read_text() == str(LIMITS.processes)
        assert not (sandbox / "supervisor" / "memory.max").exists()
        assert set(fds) == {"model", "supervisor", "oom"}
        cgroups.charge_cpu(fds)  # the supervisor: its leaf
        cgroups.join(fds)  # a model's process: the model's leaf only
        assert (sandbox / "supervisor" / "cgroup.procs").read_text() == str(os.getpid())
        assert (sandbox / "model" / "cgroup.procs").read_text() == str(os.getpid())
        assert cgroups.oom_kills(fds) == 2  # memory.events' oom_kill, as v1's memory.oom_control
        (sandbox / "cgroup.events").write_text("populated 1\nfrozen 0\n")
        assert not cgroups.is_empty({"unified": dir_fd}, "sandbox-7")
        (sandbox / "cgroup.events").write_text("populated 0\nfrozen 0\n")
        assert cgroups.is_empty({"unified": dir_fd}, "sandbox-7")
    finally:
        for fd in fds.values():
            os.close(fd)
        os.close(dir_fd)


def test_a_kernel_without_swap_accounting_still_gets_a_sandbox(v2, tmp_path):
    client = tmp_path / "client"
    kernel_files(client / "sandbox-9")
    (client / "sandbox-9" / "model" / "memory.swap.max").unlink()
    dir_fd = os.open(client, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fds = cgroups.make_sandbox({"unified": dir_fd}, "sandbox-9", LIMITS)
        for fd in fds.values():
            os.close(fd)
    finally:
        os.close(dir_fd)
