"""The local sandbox as the environment uses it: a persistent PyTorch session, bash beside it,
`result` read back strictly, and the prime_sandboxes-shaped client under SandboxEnv's own code."""

import logging
import os

import pytest
import torch
from datasets import Dataset
from prime_sandboxes import CommandTimeoutError, SandboxNotRunningError

import pytorch_env
import verifiers as vf
from ptenv.inside import codec
from ptenv.host import requests, transports
from ptenv.host.blame import HarnessFault, ModelFault
from ptenv.host.requests import parse_cell_reply, parse_result_doc, preload_fields
from ptenv.host.local import LocalSandboxClient
from ptenv.inside.protocol import Limits
from tests.support.sandbox import new_box, sandbox_processes, supervisor_of, only_the_sandbox_runs, wait_until

pytestmark = pytest.mark.rootless


@pytest.mark.slow
async def test_variables_models_optimisers_and_grads_persist(box):
    steps = [
        "torch.manual_seed(0)\nmodel = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)",
        "x = torch.ones(4, 3)\nloss = model(x).pow(2).mean()\nloss.backward()",
        "grad = model.weight.grad.clone()\nbefore = model.weight.detach().clone()\nopt.step()",
        "result = torch.stack([before - 0.1 * grad, model.weight.detach()])",
    ]
    for code in steps:
        assert (await box.cell(code)).status == "ok"
    stacked = await box.result()
    assert torch.allclose(stacked[0], stacked[1])  # the step used the .grad of an earlier cell
    assert (await box.cell("print(model.weight.grad is not None, type(opt).__name__)")).stdout == "True SGD\n"


@pytest.mark.slow
async def test_inputs_are_preloaded_by_name_and_restored_after_a_reset(box):
    a, b = torch.randn(3, 4), torch.arange(8, dtype=torch.int64).reshape(4, 2)
    doc = await box.client.call(box.id, "preload", preload_fields({"a": a, "b": b}), 30)
    reply = parse_cell_reply(doc, box.client.limits)
    assert reply.status == "ok", reply
    assert (await box.cell("result = a @ b.to(a.dtype)")).status == "ok"
    assert torch.equal(await box.result(), a @ b.to(a.dtype))
    assert (await box.cell("a.zero_()\nimport os\nos._exit(0)")).status == "reset"
    assert (await box.cell("result = a")).status == "ok"
    assert torch.equal(await box.result(), a)  # the fresh session loaded pristine inputs


@pytest.mark.slow
async def test_a_bad_preload_is_an_error_and_keeps_the_namespace(box):
    await box.cell("keep = 1")
    doc = await box.client.call(box.id, "preload", {"inputs": '{"x": {"dtype": "float32"}}'}, 30)
    reply = parse_cell_reply(doc, box.client.limits)
    assert reply.status == "error" and "input 'x'" in reply.stderr
    assert (await box.cell("keep")).stdout == "1\n"


def test_preload_rejects_names_that_would_shadow_the_namespace():
    for name in ("torch", "result", "__builtins__", "not valid", "class"):
        with pytest.raises(ValueError, match="input name"):
            preload_fields({name: torch.ones(1)})


@pytest.mark.slow
async def test_stdout_stderr_and_traceback_are_captured_at_the_fd_level(box):
    code = (
        "import os, sys\n"
        "print('py-out')\n"
        "print('py-err', file=sys.stderr)\n"
        "os.write(1, b'fd-out\\n')\n"
        "os.system('echo from-a-shell')\n"
        "def boom():\n"
        "    raise ValueError('bad shape')\n"
        "boom()\n"
    )
    reply = await box.cell(code)
    assert reply.status == "error"
    for text in ("py-out", "fd-out", "from-a-shell"):
        assert text in reply.stdout
    assert reply.stderr.startswith("py-err\n")
    assert 'File "<cell' in reply.stderr and "boom()" in reply.stderr and "ValueError: bad shape" in reply.stderr
    assert "interpreter.py" not in reply.stderr  # the interpreter's own frames are not shown
    assert "ValueError: bad shape" in reply.text()


@pytest.mark.slow
async def test_last_expression_is_shown_and_syntax_errors_are_reported(box):
    assert (await box.cell("x = 2\nx * 21")).text() == "42"
    assert (await box.cell("")).text() == "(no output)"
    reply = await box.cell("def f(:\n  pass")
    assert reply.status == "error" and "SyntaxError" in reply.stderr


@pytest.mark.slow
async def test_output_is_capped_with_a_notice(box):
    reply = await box.cell("import sys\nprint('x' * (20 * 2**20))\nn = sys.stderr.write('y' * 50000)")
    cap = box.client.limits.output_bytes
    assert reply.status == "ok"
    assert len(reply.stdout.encode()) == cap and len(reply.stderr.encode()) == cap
    assert f"{20 * 2**20 + 1 - cap:,} more bytes of stdout were cut (the first {cap:,} are shown)" in reply.note
    assert f"{50000 - cap:,} more bytes of stderr were cut" in reply.note
    assert reply.note in reply.text()
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_a_transport_with_more_output_returns_it_whole_and_says_what_it_kept():
    """The limits a transport is created with are the ones its sandboxes enforce and its replies are read by."""
    limits = Limits(cell_timeout=10, output_bytes=64 * 1024)
    transport = transports.create("local", limits)
    try:
        sandbox = await transport.client.create(transport.request)
        await requests.preload(transport.call, sandbox.id, {}, timeout=transport.command_timeout, limits=transport.limits)
        whole = await requests.run_cell(transport.call, sandbox.id, "print('x' * 40 * 1024)", timeout=30, limits=transport.limits)
        assert whole == "x" * 40 * 1024
        cut = await requests.run_cell(transport.call, sandbox.id, "print('x' * 100 * 1024)", timeout=30, limits=transport.limits)
        assert cut.endswith(f"[{100 * 1024 + 1 - 65536:,} more bytes of stdout were cut (the first 65,536 are shown).]")
    finally:
        transport.client.teardown()


@pytest.mark.slow
async def test_result_comes_back_as_a_plain_tensor_or_a_clean_failure(box):
    assert await box.result() is None
    cases = {
        "result = torch.nn.Parameter(torch.ones(2, 2))": torch.ones(2, 2),
        "result = torch.arange(12.).reshape(3, 4).t()[1:]": torch.arange(12.0).reshape(3, 4).t()[1:],
        "result = torch.tensor([1 + 2j]).conj()": torch.tensor([1 - 2j]),
        "result = (torch.ones(3, requires_grad=True) * 2)": torch.full((3,), 2.0),
    }
    for code, expected in cases.items():
        await box.cell(code)
        got = await box.result()
        assert type(got) is torch.Tensor and not got.requires_grad and torch.equal(got, expected), code
    failures = {
        "class Liar(torch.Tensor):\n    pass\nresult = torch.ones(2).as_subclass(Liar)": "result is a Liar, not a torch.Tensor",
        "result = torch.empty(3, device='meta')": "result is a meta tensor",
        "result = 3": "result is a int, not a torch.Tensor",
        "result = torch.sort(torch.ones(2))": "result is a torch.return_types.sort, not a torch.Tensor",
        "result = torch.ones(2).to_sparse()": "expected a dense tensor",
        "result = torch.zeros(8 * 2**20 + 1)": "over the 33554432-byte cap",
    }
    for code, reason in failures.items():
        await box.cell(code)
        with pytest.raises(ModelFault, match=reason):
            await box.result()
    await box.cell("del result")
    assert await box.result() is None


@pytest.mark.slow
async def test_a_session_broken_by_the_model_never_yields_a_false_result(box):
    await box.cell("result = torch.ones(2) * 3\ntorch = None\nimport sys\nsys.modules['torch'] = None")
    assert torch.equal(await box.result(), torch.full((2,), 3.0))  # the session kept its own references
    # The encoder the session calls is replaced: the host's strict decode refuses what it sends.
    await box.cell("import json, ptenv.inside.codec\n"
                   "ptenv.inside.codec.to_bytes = lambda t: ({'dtype': 'bool', 'shape': [4]}, bytearray(b'\\2' * 4))\n"
                   "json.dumps = lambda *a, **k: '{}'")  # the session's own reference is kept
    with pytest.raises(ModelFault, match="could not be decoded: bool data has bytes other than 0 and 1"):
        await box.result()
    # Patched builtins may break the session itself: then it is restarted and `result` is gone.
    await box.cell("import builtins\nbuiltins.type = lambda *a: int\nresult = 'a string'")
    with pytest.raises(ModelFault, match="result is a int"):
        await box.result()
    reply = await box.cell("import builtins\nbuiltins.isinstance = None\nbuiltins.len = None")
    assert reply.status == "reset" and "The session broke" in reply.note
    assert await box.result() is None
    await only_the_sandbox_runs(box)


def test_result_replies_are_parsed_strictly():
    good = codec.encode(torch.ones(2))
    assert torch.equal(parse_result_doc({"status": "ok", "result": good}), torch.ones(2))
    bad = [
        None,
        [],
        {},
        {"status": "ok"},
        {"status": "missing", "extra": 1},
        {"status": "ok", "result": {**good, "data": "!!"}},
        {"status": "ok", "result": {**good, "shape": [3]}},
        {"status": "invalid", "reason": 7},
    ]
    for doc in bad:
        with pytest.raises(ModelFault):
            parse_result_doc(doc)
    with pytest.raises(ModelFault, match="^line one line two$"):
        parse_result_doc({"status": "invalid", "reason": "line one\nline two"})


def test_cell_replies_are_parsed_strictly():
    doc = {"status": "ok", "stdout": "", "stderr": "", "stdout_cut": 0, "stderr_cut": 0, "reset": None, "limit": 30}
    assert parse_cell_reply(doc, Limits()).text() == "(no output)"
    for change in ({"status": "fine"}, {"stdout": 3}, {"stdout_cut": -1}, {"reset": 1}, {"extra": 1}):
        with pytest.raises(HarnessFault):
            parse_cell_reply({**doc, **change}, Limits())
    for other in (None, "", [], "x" * (1 << 20)):
        with pytest.raises(HarnessFault):
            parse_cell_reply(other, Limits())
    timeout = parse_cell_reply({**doc, "status": "timeout", "reset": "ran past the time limit"}, Limits())
    assert timeout.note.startswith("The cell was stopped after the 30 s time limit and the session was restarted")


@pytest.mark.slow
async def test_bash_runs_in_the_same_sandbox_as_the_cells(box):
    await box.cell("open('/tmp/from_cell.txt', 'w').write('cell')")
    assert (await box.sh("cat from_cell.txt; echo bash > from_bash.txt")).stdout == "cell"
    assert (await box.cell("print(open('from_bash.txt').read())")).stdout == "bash\n\n"
    response = await box.sh("mkdir -p d && cd d && pwd && echo oops >&2 && exit 3")
    assert (response.stdout, response.stderr, response.exit_code) == ("/tmp/d\n", "oops\n", 3)
    assert (await box.sh("pwd", working_dir="/tmp/d")).stdout == "/tmp/d\n"
    assert (await box.sh("pwd", working_dir="/nowhere")).exit_code != 0
    assert (await box.sh("yes | head -2")).stdout == "y\ny\n"  # SIGPIPE is back to its default
    assert (await box.sh("python -c 'import torch; print(torch.ones(2).sum().item())'", timeout=30)).stdout == "2.0\n"


@pytest.mark.slow
async def test_a_command_past_its_timeout_is_killed(box):
    with pytest.raises(CommandTimeoutError):
        await box.sh("sleep 30 & sleep 30", timeout=0.5)
    await only_the_sandbox_runs(box)
    assert (await box.sh("echo still here")).stdout == "still here\n"


@pytest.mark.slow
async def test_background_jobs_do_not_outlive_their_command(box):
    assert (await box.sh("sleep 100 & echo started")).stdout == "started\n"
    await only_the_sandbox_runs(box)


@pytest.mark.slow
async def test_unknown_and_deleted_sandboxes_raise_cleanly(client):
    with pytest.raises(SandboxNotRunningError, match="does not exist"):
        await client.execute_command("local-nope", "true")
    with pytest.raises(SandboxNotRunningError):
        await client.wait_for_creation("local-nope")
    box = await new_box(client)
    await client.wait_for_creation(box.id)
    await client.delete(box.id)
    await client.delete(box.id)  # idempotent: SandboxEnv retries a delete that raised
    with pytest.raises(SandboxNotRunningError, match="does not exist or was deleted"):
        await client.execute_command(box.id, "true")
    assert wait_until(lambda: not box.processes())  # killed at once, reaped without blocking the fork server


@pytest.mark.slow
async def test_bulk_delete_kills_every_sandbox(client):
    boxes = [await new_box(client) for _ in range(3)]
    response = await client.bulk_delete([b.id for b in boxes])
    assert sorted(response.succeeded) == sorted(b.id for b in boxes)
    assert wait_until(lambda: all(not b.processes() for b in boxes))


@pytest.mark.slow
async def test_sandbox_env_runs_unchanged_on_the_local_client():
    env = vf.SandboxEnv(
        dataset=Dataset.from_list([{"question": "q", "answer": ""}]), start_command=None, timeout_per_command_seconds=1
    )
    env.sandbox_client = LocalSandboxClient(Limits(cell_timeout=1))
    try:
        state = await env.setup_state({"prompt": [], "completion": [], "info": {}, "answer": "", "task": "default"})
        sandbox_id, sandbox_state = state["sandbox_id"], state["sandbox_state"]
        assert await env.bash("echo hi; echo err >&2", sandbox_id, sandbox_state) == "hi\nstderr:\nerr"
        assert await env.bash("sleep 5", sandbox_id, sandbox_state) == "Error: Command timed out after 1s"
        supervisor = supervisor_of(env.sandbox_client, sandbox_id)
        await env.destroy_sandbox(state)
        assert env.active_sandboxes == set() and wait_until(lambda: not sandbox_processes(supervisor))
        with pytest.raises(vf.SandboxError):
            await env.bash("echo hi", sandbox_id, sandbox_state)
    finally:
        env.sandbox_client.teardown()


@pytest.mark.slow
async def test_exec_reply_text_for_a_code_string_with_any_characters(box):
    code = "print('ünïcödé \\u2603 \"quotes\" $HOME `ls` \\\\n')"
    assert (await box.cell(code)).stdout == 'ünïcödé ☃ "quotes" $HOME `ls` \\n\n'
    assert (await box.cell("")).text() == "(no output)"
    assert {"code": ""} == {"code": ""}


def test_load_environment_logs_the_sandbox_mode_once(caplog):
    with caplog.at_level(logging.INFO, logger="verifiers.pytorch_env"):
        env = pytorch_env.load_environment()
    lines = [r.getMessage() for r in caplog.records if r.name == "verifiers.pytorch_env"]
    mode = "root: two host uids per sandbox" if os.geteuid() == 0 else "rootless: one user namespace per sandbox"
    assert len(lines) == 1 and lines[0].startswith(f"pytorch-env local sandboxes: {mode}"), lines
    assert lines[0].endswith(env.sandbox_client.isolation_mode)
