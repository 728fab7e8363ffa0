"""The harness is total: nothing the model sends (any JSON as tool arguments, any text, any bytes
on its streams, any reply from its interpreter) becomes a harness error, and the harness's own work
for a sandbox stays bounded. Each finding of the adversarial review is here by its number."""

import asyncio
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prime_sandboxes import CommandTimeoutError, CreateSandboxRequest

import pytorch_env
from ptenv.host import requests
from ptenv.host.blame import ModelFault
from ptenv.host.local import LocalSandboxClient
from ptenv.host.transports import CELL_MARGIN
from ptenv.inside import codec
from ptenv.inside.protocol import HIDDEN_OUTPUT_CAP, MAX_FRAME, MAX_HIDDEN_CASES, MAX_HIDDEN_OUTPUTS, MAX_TENSOR_BYTES, Limits
from ptenv.host.tool_input import MAX_CHARS, problem
from ptenv.inside.replies import MAX_CONTAINERS, SKELETON_CAP, cell_status, result_doc
from tests.support.policy_server import MALFORMED_CALLS, serve_in_thread
from tests.support.sandbox import SHORT, only_the_sandbox_runs
from tests.support.vf_eval import leftover_sandboxes, run_eval

# A fixed seed in CI; scripts/fuzz runs the same properties longer with other seeds.
EXAMPLES = int(os.environ.get("PTENV_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, derandomize="PTENV_FUZZ_EXAMPLES" not in os.environ, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
NASTY = st.sampled_from(["\0", "\ud800", "\udfff", "\x1b[2J", "\r", "\u2028", "\U0001f600", "'", '"', "\\", "$(", "`"])
TEXT = st.lists(st.one_of(st.characters(), NASTY), max_size=40).map("".join)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)


def is_model_text(text) -> bool:
    """Text a model request can carry: a str that encodes as UTF-8."""
    try:
        return isinstance(text, str) and text.encode("utf-8") is not None
    except UnicodeEncodeError:
        return False


# ---- F1, F2, F4: tool arguments are checked where they enter


def test_bad_tool_arguments_are_named_in_one_message():
    assert problem("code", "print(1)", shell=False) is None
    assert problem("command", "ls -la", shell=True) is None
    assert problem("code", "x = '\0'", shell=False) is None  # Python says what is wrong with it
    cases = [("command", None, True, "`command` must be a string, got null"),
             ("command", ["ls", "-la"], True, "got an array"),
             ("code", 123, False, "got a number"),
             ("code", {"code": "x"}, False, "got an object"),
             ("command", "echo a\0b", True, "contains a NUL byte"),
             ("command", "echo \ud800", True, "a lone surrogate at index 5 (\\ud800)"),
             ("code", "x = '\udfff'", False, "a lone surrogate at index 5"),
             ("code", "#" * (MAX_CHARS + 1), False, f"the limit is {MAX_CHARS:,}")]
    for name, value, shell, message in cases:
        error = problem(name, value, shell)
        assert error is not None and error.startswith("Error: ") and message in error, (value, error)
        assert is_model_text(error) and "\n" not in error


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_malformed_tool_calls_through_the_real_vf_eval_leave_the_rollout_whole(tmp_path):
    # Every malformed call of the policy is answered as a tool message; then the reference
    # solution runs in the same sandbox and the rollout scores 1.0.
    url, stop = serve_in_thread()
    try:
        _, rows = run_eval(url, "malformed", ["-n", "3", "-r", "1", "-c", "3"], tmp_path)
    finally:
        stop()
    assert not leftover_sandboxes()
    assert len(rows) == 3
    for row in rows:
        replies = [m["content"] for m in row["completion"] if m["role"] == "tool"]
        assert row["reward"] == 1.0 and row["scoring_error"] is None and row["harness_error"] == 0.0, replies
        assert len(replies) == len(MALFORMED_CALLS) + 1
        assert all(is_model_text(reply) for reply in replies)
        joined = "\n".join(replies)
        for message in ("contains a NUL byte", "a lone surrogate", "must be a string, got an array",
                        "must be a string, got a number", "must be a string, got null", "ptenv-request: not found",
                        "ValueError: \\ud800"):
            assert message in joined, (message, joined[-2000:])


# ---- fuzzing the client boundary with a real sandbox, through the classic env's own tools


@pytest.fixture(scope="module")
def tools():
    """A classic env and one of its real sandboxes, on a loop the examples share."""
    loop = asyncio.new_event_loop()
    env = pytorch_env.load_environment()
    env.timeout_per_command_seconds = 5
    sandbox = loop.run_until_complete(env.sandbox_client.create(env.sandbox_request))
    state = {"ready": True, "command_execution_times": []}
    yield loop, env, sandbox.id, state
    env.sandbox_client.teardown()
    loop.close()


def answers(loop, env, sandbox_id) -> bool:
    cell = requests.run_cell(env.transport.call, sandbox_id, "print('alive')", timeout=30, limits=env.transport.limits)
    reply = loop.run_until_complete(cell)
    return reply == "alive"


@pytest.mark.slow
@FUZZ
@given(code=JSON)
def test_any_json_as_execute_code_is_a_tool_reply(tools, code):
    loop, env, sandbox_id, state = tools
    reply = loop.run_until_complete(env.execute_code(code, sandbox_id, state))
    assert is_model_text(reply)
    assert answers(loop, env, sandbox_id)


@pytest.mark.slow
@FUZZ
@given(command=JSON)
def test_any_json_as_a_bash_command_is_a_tool_reply(tools, command):
    loop, env, sandbox_id, state = tools
    reply = loop.run_until_complete(env.bash(command, sandbox_id, state))
    assert is_model_text(reply)
    assert answers(loop, env, sandbox_id)


@pytest.mark.slow
@FUZZ
@given(out=st.binary(max_size=4096), err=st.binary(max_size=4096))
def test_any_bytes_on_stdout_and_stderr_are_a_tool_reply(tools, out, err):
    loop, env, sandbox_id, state = tools
    code = f"import os\nos.write(1, {out!r})\nos.write(2, {err!r})"
    assert is_model_text(loop.run_until_complete(env.execute_code(code, sandbox_id, state)))
    command = f"printf '{octal(out)}'; printf '{octal(err)}' >&2"
    assert is_model_text(loop.run_until_complete(env.bash(command, sandbox_id, state)))


def octal(data: bytes) -> str:
    """Bytes as printf's octal escapes."""
    return "".join(f"\\{b:03o}" for b in data)


# ---- any timing up to the deadline: a command that ends, prints or still runs at any moment
# around its limit is a model-side reply, and the box answers the next command

TIMING_LIMIT = 2.0  # seconds: short, so each example costs little


@pytest.fixture(scope="module")
def short_cells():
    """A sandbox whose cells may run TIMING_LIMIT seconds, on a loop the examples share."""
    loop = asyncio.new_event_loop()
    client = LocalSandboxClient(Limits(cell_timeout=TIMING_LIMIT))
    sandbox = loop.run_until_complete(client.create(CreateSandboxRequest(name="timing", docker_image="local")))
    yield loop, client, sandbox.id
    client.teardown()
    loop.close()


AROUND_THE_LIMIT = st.floats(0.0, 1.3).map(lambda f: round(f * TIMING_LIMIT, 2))


@pytest.mark.slow
@settings(FUZZ, max_examples=min(EXAMPLES, 10))
@given(before=AROUND_THE_LIMIT, after=st.sampled_from(["", "print('b')", "print('b' * 100000)", "raise ValueError"]))
def test_a_cell_at_any_moment_around_its_limit_is_a_tool_reply(short_cells, before, after):
    loop, client, sandbox_id = short_cells
    code = f"import time\nprint('a', flush=True)\ntime.sleep({before})\n{after}"
    deadline = TIMING_LIMIT + CELL_MARGIN
    reply = loop.run_until_complete(requests.run_cell(client.call, sandbox_id, code, timeout=deadline, limits=client.limits))
    assert is_model_text(reply) and reply.startswith("a")
    alive = requests.run_cell(client.call, sandbox_id, "print('alive')", timeout=deadline, limits=client.limits)
    assert loop.run_until_complete(alive) == "alive"


@pytest.mark.slow
@settings(FUZZ, max_examples=min(EXAMPLES, 10))
@given(before=AROUND_THE_LIMIT, after=st.sampled_from(["", "echo b", "yes | head -c 100000", "exit 3"]))
def test_a_command_at_any_moment_around_its_limit_is_a_tool_reply(tools, before, after):
    loop, env, sandbox_id, state = tools
    env.timeout_per_command_seconds = TIMING_LIMIT
    try:
        reply = loop.run_until_complete(env.bash(f"echo a; sleep {before}; {after}", sandbox_id, state))
    finally:
        env.timeout_per_command_seconds = 5
    assert is_model_text(reply)
    assert answers(loop, env, sandbox_id)


# ---- F3: text from the model's process reaches the model escaped


@pytest.mark.slow
async def test_an_undecodable_traceback_is_shown_escaped(box):
    reply = await box.cell("result = torch.zeros(1)\nraise ValueError('\\ud800 and ' + b'\\xff'.decode('utf-8', 'surrogateescape'))")
    text = reply.text()
    assert is_model_text(text) and "ValueError: \\ud800 and \\udcff" in text
    assert (await box.result()).tolist() == [0.0]


# ---- the supervisor's parsing of its interpreter's replies (F7), without a sandbox


@FUZZ
@given(frame=st.one_of(st.binary(max_size=2048), JSON.map(lambda v: json.dumps(v).encode())))
def test_any_interpreter_reply_is_parsed_into_a_bounded_answer(frame):
    doc, nbytes = result_doc(bytearray(frame))
    assert doc["status"] in ("ok", "missing", "invalid") and len(json.dumps(doc)) < SKELETON_CAP
    assert (nbytes is None and doc["status"] == "invalid") or 0 <= nbytes <= MAX_TENSOR_BYTES
    assert nbytes in (0, None) or doc["status"] == "ok"
    status, tb = cell_status(bytearray(frame), 1000)
    assert status in (None, "ok", "error", "timeout") and len(tb) <= 1000 and is_model_text(tb)


def test_a_trial_reply_at_every_cap_fits_one_frame():
    # Past MAX_FRAME the host would refuse the supervisor's reply: a harness error made by the answer.
    shape = [1] * (codec.MAX_DIMS - 1) + [HIDDEN_OUTPUT_CAP // 4 * 3 // 16]  # the longest shape of the largest output
    codec.byte_count("complex128", shape)
    output = {"dtype": "complex128", "shape": shape, "data": "A" * HIDDEN_OUTPUT_CAP}
    case = {"status": "ok", "outputs": [output] * MAX_HIDDEN_OUTPUTS}
    reply = {"id": 1 << 60, "reply": {"load": None, "protected": True, "cases": [case] * MAX_HIDDEN_CASES}}
    assert len(json.dumps(reply)) < MAX_FRAME


def test_a_reply_that_nests_or_repeats_containers_is_refused_before_it_is_parsed():
    for frame in (b"[" * 100_000 + b"]" * 100_000, b"[" + b"[[]]," * 2_000_000 + b"[]]",
                  json.dumps({"status": "ok", "result": {"dtype": "float32", "shape": [[1]] * MAX_CONTAINERS}}).encode()):
        doc, _ = result_doc(bytearray(frame))
        assert doc["status"] == "invalid", doc


# ---- F6: a shell that leaves its process group


@pytest.mark.slow
async def test_a_shell_that_moves_out_of_its_group_is_killed_at_its_limit(box):
    escape = ('exec python3 -c "import os,time\nc=os.fork()\nif c==0: os.setpgid(0,0); time.sleep(1000); os._exit(0)\n'
              'time.sleep(0.3); os.setpgid(0,c); time.sleep(1000)"')
    await box.cell("result = torch.ones(2)")
    with pytest.raises(CommandTimeoutError):
        await box.sh(escape, timeout=SHORT)
    assert (await box.result()).tolist() == [1.0, 1.0]
    await only_the_sandbox_runs(box)


# ---- F7, F8: what a read-back costs the supervisor


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


@pytest.mark.slow
async def test_a_json_bomb_reply_is_an_invalid_answer_at_little_cost(box):
    await box.cell("import json\nencode = json._default_encoder.encode\n"
                   "json._default_encoder.encode = lambda o: '[' + '[[]],' * 8_000_000 + '[]]' if 'traceback' not in o else encode(o)\n"
                   "result = torch.zeros(2)")
    before = peak_rss_mib(box.supervisor[0])
    with pytest.raises(ModelFault, match="sent an oversized reply"):
        await box.result()
    # Refused by its length: the 40 MB frame is never read, let alone its 16 million lists parsed.
    assert peak_rss_mib(box.supervisor[0]) - before < 8, (before, peak_rss_mib(box.supervisor[0]))
    assert (await box.cell("print('alive')")).stdout == "alive\n"


@pytest.mark.slow
async def test_a_shape_torch_cannot_build_is_an_invalid_answer(box):
    # Empty by its zero, so no bytes follow; but torch refuses the other sizes on the host, and
    # that would be the harness failing on the model's answer.
    for shape, reason in (([0, 10 ** 50], "over the 33554432-byte cap"), ([0, 1 << 62, 1 << 62], "over the 33554432-byte cap"),
                          ([1] * 5000, "5000 dimensions")):
        await box.cell("import ptenv.inside.codec as codec\n"
                       f"codec.to_bytes = lambda t: ({{'dtype': 'float32', 'shape': {shape}}}, bytearray({0 if 0 in shape else 4}))\n"
                       "result = torch.zeros(1)")
        with pytest.raises(ModelFault, match=reason):
            await box.result()
        # Its bytes' frame is not read: the supervisor starts a fresh interpreter, which the next cell finds.
        assert (await box.cell("print('alive')")).stdout == "alive\n"
    await box.cell("result = torch.ones(2)")
    assert (await box.result()).tolist() == [1.0, 1.0]


@pytest.mark.slow
async def test_tensor_bytes_of_another_size_than_declared_are_never_read(box):
    # A skeleton that declares 4 bytes, then a 60 MiB frame: refused by its header.
    await box.cell("import ptenv.inside.codec as codec\n"
                   "codec.to_bytes = lambda t: ({'dtype': 'float32', 'shape': [1]}, bytearray(60 << 20))\n"
                   "result = torch.zeros(1)")
    before = peak_rss_mib(box.supervisor[0])
    with pytest.raises(ModelFault, match="in a frame of another size than it declared"):
        await box.result()
    assert peak_rss_mib(box.supervisor[0]) - before < 8, (before, peak_rss_mib(box.supervisor[0]))
    await box.cell("result = torch.ones(3)")  # a fresh interpreter: the patch and the frame are gone
    assert (await box.result()).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.slow
async def test_the_largest_read_back_costs_the_supervisor_less_than_a_hostile_reply_may(box):
    # A valid read-back of N MiB may cost 2N + 16 MiB, a hostile reply 64 MiB. The largest reply a
    # supervisor reads whole is one of the size it declares, at most the cap: it costs the same,
    # valid or not, and must stay under both.
    n_mib = MAX_TENSOR_BYTES >> 20
    await box.cell(f"result = torch.arange({n_mib << 18}, dtype=torch.int32)")
    before = peak_rss_mib(box.supervisor[0])
    assert (await box.result()).numel() == n_mib << 18
    grew = peak_rss_mib(box.supervisor[0]) - before
    assert grew <= 2 * n_mib + 16 and grew < 64, grew
