"""Hostile cells and commands against the local sandbox. For each: the host stays healthy, the
sandbox keeps working or reports a clean failure, and nothing is left running."""

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prime_sandboxes import CreateSandboxRequest, SandboxNotRunningError

from ptenv.host.local import LocalSandboxClient
from ptenv.host.view import SandboxUnavailableError
from ptenv import inside
from ptenv.inside.protocol import Limits
from tests.support.sandbox import MEMORY_MB, SHORT, SLOWDOWN, new_box, only_the_sandbox_runs, wait_until

pytestmark = pytest.mark.rootless

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
async def test_an_infinite_loop_is_stopped_and_variables_are_kept(box):
    await box.cell("kept = 7")
    reply = await box.cell("while True:\n    pass", timeout=SHORT)
    assert reply.status == "timeout" and f"{SHORT:g} s time limit; variables are kept" in reply.note
    assert (await box.cell("kept")).stdout == "7\n"
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_a_cell_that_swallows_the_timeout_is_killed_and_reset(box):
    await box.cell("kept = 7")
    swallow = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
    reply = await box.cell(swallow, timeout=SHORT)
    assert reply.status == "timeout" and "all variables were reset" in reply.note
    assert "NameError" in (await box.cell("kept")).stderr
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_one_long_torch_op_is_killed_and_the_session_reset(box):
    await box.cell("kept = 7")
    reply = await box.cell("torch.ones(1).expand(10**11).sum()", timeout=SHORT)  # one C call of about 30 s
    assert reply.status == "timeout" and "all variables were reset" in reply.note
    assert "NameError" in (await box.cell("kept")).stderr
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_a_fork_bomb_stays_in_its_sandbox(client, box):
    other = await new_box(client)
    reply = await box.cell("import os\nwhile True:\n    os.fork()", timeout=SHORT)
    assert reply.status == "timeout" or "BlockingIOError" in reply.stderr
    assert (await other.cell("print(1 + 1)")).stdout == "2\n"
    await only_the_sandbox_runs(box)
    assert (await box.sh("echo ok")).stdout == "ok\n"
    assert (await box.sh(":(){ :|:& };:", timeout=2 * SLOWDOWN)).exit_code is not None  # the shell flavour
    await only_the_sandbox_runs(box)
    await client.delete(other.id)


@pytest.mark.slow
async def test_memory_beyond_the_limit_fails_inside_the_cell(client, box):
    await box.cell("kept = 7")
    for code in ("x = torch.empty(10**10, dtype=torch.uint8)", "b = bytearray(8 * 2**30)"):
        reply = await box.cell(code)
        assert reply.status == "error" and ("can't allocate memory" in reply.stderr or "MemoryError" in reply.stderr)
    reply = await box.cell("chunks = []\nwhile True:\n    chunks.append(torch.ones(2**24))")
    after = await box.cell("del chunks\nkept")
    if client.cgroup_mode.startswith("cgroup v"):  # the address-space limit comes first
        assert reply.status == "error" and "allocate" in reply.stderr
        assert after.stdout == "7\n"
    else:  # the polled sum also counts the interpreter's share of torch: it may come first
        memory = f"used more than its {MEMORY_MB} MiB of memory"
        assert (reply.status == "error" and "allocate" in reply.stderr) or memory in reply.note, reply
        assert after.stdout == "7\n" or memory in reply.note + after.note, after
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_file_size_and_scratch_space_are_capped(box):
    reply = await box.cell("open('/tmp/big', 'wb').write(b'0' * (300 * 2**20))")
    assert "File too large" in reply.stderr
    response = await box.sh("dd if=/dev/zero of=/tmp/big bs=1M count=300")
    assert response.exit_code != 0
    response = await box.sh("for i in 1 2 3; do head -c 100000000 /dev/zero > /tmp/f$i || exit 9; done")
    assert response.exit_code == 9 and "No space left" in response.stderr
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_the_answer_key_and_the_host_are_not_visible(box, tmp_path):
    canary = tmp_path / "answer_key.jsonl"
    canary.write_text('{"expected_output": "secret"}\n')
    home = Path.home()
    paths = [canary, REPO / "train.jsonl", REPO, REPO / ".venv", home / ".cache" / "huggingface", Path("/work"), Path("/home")]
    for path in paths:
        reply = await box.cell(f"import os\nprint(os.listdir({str(path)!r}) if os.path.isdir({str(path)!r}) else open({str(path)!r}).read())")
        assert reply.status == "error" and ("No such file" in reply.stderr or "Permission denied" in reply.stderr), path
        assert (await box.sh(f"cat {path} || ls {path}")).exit_code != 0
    # Of the host's home only the path to the Python installation exists (read-only).
    prefix = Path(sys.base_prefix)
    visible = [prefix.relative_to(home).parts[0]] if prefix.is_relative_to(home) else []
    reply = await box.cell(f"import os\nprint(sorted(os.listdir({str(home)!r})))")
    assert reply.stdout.strip() == repr(visible) or (not visible and "No such file" in reply.stderr)
    # Only ptenv/inside is there; the installed project files are masked.
    assert "ModuleNotFoundError" in (await box.cell("import ptenv.tasks.canonical")).stderr
    listing = await box.sh("cd /opt/ptenv && find . -type f | sort")
    assert listing.stdout.split() == sorted(f"./{path}" for path in inside.FILES)
    assert not any(word in path for word in ("tasks", "dataset", "grader") for path in inside.FILES)
    assert (await box.sh("cat /opt/site-packages/pytorch_env-*.dist-info/RECORD")).exit_code != 0


@pytest.mark.slow
async def test_the_interpreter_and_libraries_are_read_only(box):
    prefix = sys.base_prefix
    targets = ["/usr/lib/x", f"{prefix}/lib/x", "/opt/site-packages/torch/x", "/opt/ptenv/ptenv/inside/codec.py", "/etc/passwd"]
    for target in targets:
        reply = await box.cell(f"open({target!r}, 'w').write('x')")
        assert reply.status == "error" and ("Read-only" in reply.stderr or "Permission denied" in reply.stderr), target
    assert (await box.sh("touch /usr/x || touch /x || mkdir /opt/x")).exit_code != 0


@pytest.mark.slow
async def test_there_is_no_network(box):
    for address in ("('127.0.0.1', 22)", "('1.1.1.1', 80)", "('::1', 22, 0, 0)"):
        family = "AF_INET6" if "::" in address else "AF_INET"
        reply = await box.cell(f"import socket\ns = socket.socket(socket.{family})\ns.settimeout(2)\ns.connect({address})")
        assert reply.status == "error" and ("unreachable" in reply.stderr or "Cannot assign" in reply.stderr), address
    assert (await box.sh("getent hosts pypi.org || exit 1")).exit_code != 0


@pytest.mark.slow
async def test_kill_everything_visible_harms_only_the_sandbox(client, box):
    other = await new_box(client)
    await box.cell("kept = 7")
    reply = await box.cell("import os\nos.system('kill -9 -1')\nprint('never')")
    assert reply.status == "reset" and "killed by SIGKILL" in reply.note
    await box.sh("kill -9 -1")
    reply = await box.cell("print('back')")
    assert "killed by SIGKILL" in reply.note  # the session died between the cells
    assert reply.stdout == ("" if reply.status == "reset" else "back\n")  # reset: the cell did not run
    assert (await box.cell("print('back')")).stdout == "back\n"
    assert (await other.cell("print(1 + 1)")).stdout == "2\n"
    assert len(other.processes()) == 2
    assert (await box.sh("kill -9 1; kill -STOP 1; echo sent")).stdout == "sent\n"  # init ignores them
    await only_the_sandbox_runs(box)
    await client.delete(other.id)


@pytest.mark.slow
async def test_the_model_cannot_touch_its_supervisor(box):
    # Root: the supervisor runs as a uid of its own. Rootless: the same uid, but PID 1 ignores
    # signals from inside, hidepid hides it and seccomp keeps per-pid calls to the caller itself.
    before = _supervisor_settings(box.supervisor[0])
    attempts = {
        "renice": "os.setpriority(os.PRIO_PROCESS, 1, 19)",
        "scheduler": "os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))",
        "affinity": "os.sched_setaffinity(1, {0})",
        "prlimit": "resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))",
        "memory": "open('/proc/1/mem', 'rb').read(1)",
        "environ": "open('/proc/1/environ', 'rb').read()",
        "oom score": "open('/proc/1/oom_score_adj', 'w').write('1000')",
        "autogroup": "open('/proc/1/autogroup', 'w').write('19')",
    }
    for what, code in attempts.items():
        reply = await box.cell(f"import os, signal, resource\n{code}")
        assert reply.status == "error" and ("PermissionError" in reply.stderr or "FileNotFoundError" in reply.stderr), (what, reply)
    for sig in ("INT", "TERM", "KILL", "STOP", "USR1"):
        await box.sh(f"kill -{sig} 1")
        await box.cell(f"import os, signal\ntry:\n    os.kill(1, signal.SIG{sig})\nexcept OSError:\n    pass")
    assert (await box.sh("renice -n 19 -p 1")).exit_code != 0
    await box.sh("renice -n 19 -u $(id -u)")  # root: the model's own uid only; rootless: denied
    assert _supervisor_settings(box.supervisor[0]) == before and box.processes()[0] == box.supervisor[0]
    # Its scratch is the model's to break, and breaking it is the model's problem only.
    await box.cell("import os\nos.chmod('/tmp', 0)")
    reply = await box.sh("echo hi")
    assert reply.exit_code == 2 and "Permission denied" in reply.stderr
    assert (await box.sh("echo hi", working_dir="/")).stdout == "hi\n"
    assert (await box.cell("print(1 + 1)")).stdout == "2\n"


def _supervisor_settings(pid: int) -> tuple:
    """What a model would change to starve or break its supervisor: nice, scheduling policy, CPU
    affinity, state (running, not stopped) and the open-files limit, as the host sees them."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    with open(f"/proc/{pid}/limits") as f:
        files = next(line for line in f if line.startswith("Max open files"))
    return fields[16], fields[38], status["Cpus_allowed_list"].strip(), fields[0] in "RS", files


def b64(obj) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    "ptenv-request read_result",
    f"ptenv-request run_cell {b64({'code': 'result = torch.zeros(2)', 'timeout': 5})}",
    f"ptenv-request preload {b64({'inputs': '{}', 'timeout': 5})}",
    f"ptenv-request end_session {b64({'timeout': 5})}",
    f"ptenv-request trial {b64({'source': 'def f(): pass', 'name': 'f', 'inputs': '{}', 'cases': [], 'timeout': 5})}",
    f"ptenv-request shell {b64({'command': 'true', 'cwd': '/tmp' + chr(0) + 'x', 'timeout': 5})}",
    f"ptenv-request shell {b64({'command': 'sleep 100', 'cwd': None, 'timeout': 1e9})}",
])
async def test_the_harness_requests_are_out_of_the_models_reach(box, command):
    # The harness's own requests are typed frames on the host's channel, never parsed out of a
    # command: a model's command that names them is only a command (and there is no such program).
    await box.cell("result = torch.ones(2)")
    reply = await box.sh(command, timeout=SHORT)
    assert reply.exit_code == 127 and "not found" in reply.stderr, reply
    assert (await box.result()).tolist() == [1.0, 1.0]
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_a_dead_supervisor_is_reported_not_waited_for(box):
    os.kill(box.supervisor[0], signal.SIGKILL)
    with pytest.raises(SandboxNotRunningError, match="is not running"):
        await box.sh("echo hi")
    assert wait_until(lambda: not box.processes())


@pytest.mark.slow
async def test_exits_inside_a_cell(box):
    await box.cell("kept = 7")
    for code in ("import sys\nsys.exit()", "exit(3)", "raise KeyboardInterrupt"):
        reply = await box.cell(code)
        assert reply.status == "error" and ("SystemExit" in reply.stderr or "KeyboardInterrupt" in reply.stderr)
    assert (await box.cell("kept")).stdout == "7\n"
    reply = await box.cell("import os\nos._exit(0)")
    assert reply.status == "reset" and "exited with code 0" in reply.note
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_sandboxes_cannot_see_each_other(client, box):
    other = await new_box(client)
    await box.sh("echo secret > /tmp/mine && echo shm > /dev/shm/mine && sleep 0")
    for path in ("/tmp/mine", "/dev/shm/mine"):
        assert (await other.sh(f"cat {path}")).exit_code != 0
    ps = await other.sh("ps -e -o pid=,comm=")
    pids = [int(line.split()[0]) for line in ps.stdout.splitlines()]
    assert 1 not in pids and len(pids) <= 3  # its session, the shell and ps; its supervisor is hidden
    assert (await other.sh("cat /proc/1/environ || ls /proc/1/fd")).exit_code != 0  # supervisor: not dumpable
    assert (await other.sh(f"kill -0 {box.processes()[0]}")).exit_code != 0
    assert (await other.cell("import os\nprint(os.getuid() != os.geteuid() or os.getuid() > 0)")).stdout == "True\n"
    await client.delete(other.id)


@pytest.mark.slow
async def test_cpu_time_is_limited():
    client = LocalSandboxClient(Limits(cell_timeout=0.3 * SLOWDOWN))  # 10 cells' worth of CPU per process: 3 s
    try:
        box = await new_box(client)
        spin = "import threading\ndef spin():\n    while True:\n        pass\nthreading.Thread(target=spin, daemon=True).start()"
        assert (await box.cell(spin)).status == "ok"
        assert wait_until(lambda: len(box.processes()) == 1, timeout=60)  # the session is gone
        reply = await box.cell("print('fresh')")
        assert reply.stdout == "fresh\n" and "SIGXCPU (the CPU time limit)" in reply.note, reply
    finally:
        client.teardown()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_missing_bubblewrap_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailableError) as caught:
        _create_one(LocalSandboxClient())
    message = str(caught.value)
    assert "apt-get install bubblewrap" in message and "unsandboxed" in message and "\n" not in message


@pytest.mark.slow
def test_a_machine_that_cannot_isolate_is_one_clear_line(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SandboxUnavailableError) as caught:
        _create_one(LocalSandboxClient())
    message = str(caught.value)
    assert "Creating new namespace failed" in message and "namespaces" in message and "\n" not in message
    assert all(option in message for option in ("--security-opt seccomp=unconfined", "a pod", 'sandbox="prime"'))


def _create_one(client: LocalSandboxClient) -> None:
    import asyncio

    try:
        asyncio.run(client.create(CreateSandboxRequest(name="t", docker_image="local")))
    finally:
        client.teardown()


HOST_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os
    from prime_sandboxes import CreateSandboxRequest, SandboxNotRunningError
    from ptenv.host.local import LocalSandboxClient

    async def main():
        client = LocalSandboxClient()
        ids = [(await client.create(CreateSandboxRequest(name="t", docker_image="local"))).id for _ in range(2)]
        await client.execute_command(ids[0], "echo > /tmp/scratch-file", timeout=10)
        print(json.dumps(ids), flush=True)
        await asyncio.to_thread(input)
        if os.environ.get("TEARDOWN"):
            client.teardown()
            print("done", flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
    """
)


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["teardown", "SIGINT", "SIGKILL"])
def test_nothing_outlives_the_host(how):
    env = {**os.environ, "TEARDOWN": "1" if how == "teardown" else ""}
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO
    )
    try:
        assert len(json.loads(host.stdout.readline())) == 2
        tree = descendants(host.pid)
        assert len(tree) >= 2 * 2 + 1
        host.stdin.write(b"go\n")
        host.stdin.flush()
        if how == "teardown":
            assert host.stdout.readline() == b"done\n"
        else:
            host.send_signal(getattr(signal, how))
            host.wait(timeout=60)  # generous: a loaded machine

        def alive():
            return [p for p in tree if _state(p) not in ("gone", "Z")]

        assert wait_until(lambda: not alive(), timeout=10), f"left running: {alive()}"
        assert not list(Path("/tmp").glob("scratch-file"))  # scratch lived in the sandbox's own tmpfs
    finally:
        host.kill()
        host.wait()


@pytest.mark.slow
async def test_many_processes_together_cannot_pass_the_sandbox_memory_limit(box):
    # Each process stays under its own address-space limit; together they hold 1 GiB of a 512 MiB sandbox.
    forks = "import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        hog = b'x' * (200 << 20)\n        time.sleep(30)\n        os._exit(0)\ntime.sleep(30)\n"
    reply = await box.cell(forks)
    assert reply.status == "reset" and f"used more than its {MEMORY_MB} MiB of memory" in reply.note, reply
    await only_the_sandbox_runs(box)

    command = " & ".join(["python3 -c \"import time; hog = b'x' * (200 << 20); time.sleep(30)\""] * 5) + " & wait"
    done = await box.sh(command, timeout=30)
    assert done.exit_code == 137 and f"the sandbox used more than its {MEMORY_MB} MiB of memory" in done.stderr, done
    await only_the_sandbox_runs(box)
