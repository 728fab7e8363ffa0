"""The trial is total too (issue 34): nothing a function task's answer does in its trial (load
slowly and die, write its own frames, be killed by any signal, send the largest replies, hide its
code after a run of blanks) becomes a harness fault, and a trial ends by one deadline the host's
wait covers. Each finding is here by its number: unit properties of what the supervisor parses, a
real sandbox, and the real vf-eval (verifiers 0.4's run is in tests/test_v1_env.py)."""

import asyncio
import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prime_sandboxes import CreateSandboxRequest

from ptenv.env.rollout import assess_rollout, start_draw
from ptenv.host import answer, requests, transports
from ptenv.host.assess import assess_function
from ptenv.host.local import LocalSandboxClient
from ptenv.inside import trial
from ptenv.inside.memory import parse_stat
from ptenv.inside.processes import is_live_process_of
from ptenv.inside.protocol import HIDDEN_OUTPUT_CAP, MAX_HIDDEN_CASES, MAX_HIDDEN_OUTPUTS, Limits
from ptenv.inside.replies import describe
from ptenv.tasks import efficiency, tiers
from ptenv.tasks.fn_intermediate import SEGMENT_MEAN
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.rows import dumps_rows, parse_row
from tests.support.hostile_functions import HEADER, TRIAL_ANSWERS, TRIAL_MESSAGES, TRIAL_PLAYS, TRIAL_REASONS
from tests.support.policy_server import serve_in_thread
from tests.support.sandbox import new_box
from tests.support.vf_eval import leftover_sandboxes, run_eval

FUZZ = settings(max_examples=200, derandomize=True, deadline=None)
# A fixed seed in CI; scripts/fuzz runs the sandbox property longer with other seeds.
EXAMPLES = int(os.environ.get("PTENV_FUZZ_EXAMPLES", "12"))
CASES = HiddenCases("trial-test-secret", 4)


# ---- F5, and every function of the supervisor that takes a value the model controls


def test_every_signal_and_exit_code_is_described():
    for number in range(1, 65):
        assert describe(number).startswith("was killed by "), number  # a wait status of a signal death
    assert describe(40) == "was killed by SIGRTMIN+6" and describe(9) == "was killed by SIGKILL"
    assert describe(3 << 8) == "exited with code 3"


@FUZZ
@given(st.integers(-(1 << 70), 1 << 70))
def test_any_wait_status_is_described(status):
    assert isinstance(describe(status), str)


@FUZZ
@given(st.binary(max_size=400), st.binary(max_size=40))
def test_any_stat_line_parses_or_is_left_out(tail, comm):
    line = b"17 (" + comm + b") " + tail
    parsed = parse_stat(line)
    assert parsed is None or all(type(v) is int for v in parsed)


def test_a_stat_line_with_parentheses_in_its_name_parses():
    fields = ["S"] + [str(i) for i in range(1, 45)]
    assert parse_stat(f"17 (a) b) (c) {' '.join(fields)}".encode()) == (19, 7 + 9)  # start time, minflt + majflt


@FUZZ
@given(st.binary(max_size=400))
def test_any_status_text_is_read_by_the_kernels_lines_only(text):
    assert is_live_process_of(text, 1000) in (True, False)
    forged = b"Name:\tx\\nUid:\t1000\nState:\tS (sleeping)\nUid:\t0\t0\t0\t0\n"
    assert not is_live_process_of(forged, 1000)  # a name's escaped newline is no line of its own


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8).map(lambda v: json.dumps(v).encode())))
def test_any_first_frame_of_a_caller_is_a_status_or_none(frame):
    status = trial.caller_status(bytearray(frame))
    assert status is None or status[0] == "prepared" and type(status[1]) is bool \
        or status[0] == "unprepared" and isinstance(status[1], str)


REPORTS = st.lists(st.one_of(
    st.builds(lambda s, r: {"status": s, "reason": r}, st.sampled_from(["error", "died", "timeout"]), st.text(max_size=30)),
    st.builds(lambda n: {"status": "ok", "outputs": [{"dtype": "float32", "shape": [2], "data": bytearray(b"AAAAAAAAAAA=")}] * n},
              st.integers(1, MAX_HIDDEN_OUTPUTS))), min_size=1, max_size=6)


@FUZZ
@given(REPORTS, st.none() | st.text(max_size=30), st.booleans())
def test_a_trial_reply_sent_in_pieces_is_one_document_the_host_reads(reports, load, protected):
    # F7: the outputs go out as they came (pieces), never copied into one string; the frame they make is JSON.
    frame = b"".join(bytes(p) for p in trial.reply_pieces(load, protected, reports))
    doc = json.loads(frame)["reply"]
    assert (doc["load"], doc["protected"], len(doc["cases"])) == (load, protected, len(reports))
    if load is None:
        results, read_protected = requests.parse_trial_reply(doc, len(reports))
        assert read_protected == protected and [r.status for r in results] == [r["status"] for r in reports]


# ---- in a real sandbox


async def play(box, source: str, level: int = 1, cases=None):
    """The trial of an answer to SEGMENT_MEAN in `box` (the in-place path: Prime's, and level 1's)."""
    cases = cases or CASES.of(SEGMENT_MEAN, 3)
    return await assess_function(box.client.call, box.id, source=source, name=SEGMENT_MEAN.name,
                                 inputs=SEGMENT_MEAN.instance("intermediate", 3).inputs(),
                                 cases=cases, allowlist=SEGMENT_MEAN.allowlist(level),
                                 limits=box.client.limits, partial_credit=False,
                                 budgets=efficiency.budgets(SEGMENT_MEAN, cases) if level == efficiency.LEVEL else None)


def answer_to(play_name: str) -> str:
    return TRIAL_ANSWERS[play_name].replace("{name}", SEGMENT_MEAN.name)


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.parametrize("level", [1, 2, 3])
async def test_f4_an_answer_forging_the_callers_status_fails_as_the_model(box, level):
    outcome = await play(box, answer_to("F4_forge_the_status"), level)
    assert outcome.scoring_error is None and outcome.verdict.score == 0.0
    assert TRIAL_REASONS["F4_forge_the_status"] in outcome.verdict.reason, outcome.verdict.reason


@pytest.mark.slow
@pytest.mark.rootless
async def test_f5_a_real_time_signal_is_named_in_a_cell_a_command_and_a_call(box):
    assert "SIGRTMIN+6" in (await play(box, answer_to("F5_real_time_signal"))).verdict.reason
    reply = await box.cell("import os\nos.kill(os.getpid(), 40)")
    assert reply.status == "reset" and "was killed by SIGRTMIN+6" in reply.note, reply
    pid = (await box.cell("import os\nprint(os.getpid())")).stdout.strip()
    # a fatal signal takes effect when its target next runs: wait until it has died (a zombie), so
    # that the next cell finds a dead session and restarts it, rather than dying under the cell
    await box.sh(f"kill -40 {pid}; while ! grep -qs '^State:.*Z' /proc/{pid}/status && [ -e /proc/{pid} ]; "
                 "do sleep 0.05; done")
    reply = await box.cell("print(1)")
    assert reply.status == "ok" and reply.stdout == "1\n" and "was killed by SIGRTMIN+6" in reply.note, reply  # the session restarted


@pytest.fixture
def short_client():
    """Sandboxes whose cell limit, and so a trial's budget for loading its answer, is 3 s."""
    client = LocalSandboxClient(Limits(cell_timeout=3.0, grace=1.0))
    yield client
    client.teardown()


@pytest.mark.slow
@pytest.mark.rootless
async def test_f1_a_slow_loading_answer_whose_calls_die_costs_one_load_budget(short_client):
    box = await short_client.create(CreateSandboxRequest(name="f1", docker_image="local"))
    source = TRIAL_ANSWERS["F1_slow_load_calls_die"].replace("time.sleep(20)", "time.sleep(2)").replace(
        "{name}", SEGMENT_MEAN.name)
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcome = await assess_function(short_client.call, box.id, source=source, name=SEGMENT_MEAN.name,
                                    inputs=SEGMENT_MEAN.instance("intermediate", 3).inputs(),
                                    cases=CASES.of(SEGMENT_MEAN, 3), allowlist=None, limits=short_client.limits,
                                    partial_credit=True)
    assert outcome.scoring_error is None and outcome.verdict.score == 0.0, outcome
    assert "exited with code 3" in outcome.verdict.reason
    # The second caller had what was left of the 3 s load budget, not 3 s more: the trial ended
    # within one budget of loading, not one per caller (the host's wait held anyway).
    assert loop.time() - start < requests.trial_timeout(short_client.limits, 4)
    await short_client.delete(box.id)


# The trial's deadline against every timing of a hostile caller: an import that sleeps, calls that
# die, hang, or write their own frames (a head, an output's skeleton or bytes) at any moment, in any
# order and of any size. Whatever it does, the supervisor replies before the host's wait ends, with
# a reply the host reads, and no case passes that did not return.
STEP = st.one_of(
    st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.3, 0.9, 1.6])),
    st.tuples(st.just("frame"), st.one_of(
        st.sampled_from([{"status": "ok", "count": 1}, {"status": "ok", "count": 9}, {"status": "ready"},
                         {"status": "ok", "result": {"dtype": "float32", "shape": [1]}},
                         {"status": "ok", "result": {"dtype": "float32", "shape": [1 << 20]}},
                         {"status": "error", "reason": "x"}, {"status": "prepared", "protected": True}]),
        st.binary(max_size=40))),
    st.tuples(st.just("raw"), st.sampled_from([b"\x00" * 8, b"\xff" * 8, struct.pack(">Q", 4) + b"AAAA",
                                               struct.pack(">Q", 1 << 40), b"\x00\x00\x00"])),
    st.tuples(st.just("exit"), st.sampled_from([0, 3, 70])),
    st.tuples(st.just("signal"), st.sampled_from([9, 11, 40, 64])),
    st.tuples(st.just("hang"), st.just(0)),
)
CALLS = st.lists(st.lists(STEP, max_size=4), min_size=1, max_size=4)
PROGRAM = """
import json, os, stat, struct, time
def channel():
    return next(fd for fd in range(3, 64) if os.path.exists(f"/proc/self/fd/{fd}") and stat.S_ISSOCK(os.fstat(fd).st_mode))
def run(steps):
    for kind, value in steps:
        if kind == "sleep": time.sleep(value)
        elif kind == "frame":
            data = value if isinstance(value, bytes) else json.dumps(value).encode()
            os.write(channel(), struct.pack(">Q", len(data)) + data)
        elif kind == "raw": os.write(channel(), value)
        elif kind == "exit": os._exit(value)
        elif kind == "signal": os.kill(os.getpid(), value)
        elif kind == "hang":
            while True: pass
run(IMPORT)
CALL_STEPS = CALLS
count = [0]
def {name}(**kwargs):
    steps = CALL_STEPS[min(count[0], len(CALL_STEPS) - 1)]
    count[0] += 1
    run(steps)
    return torch.zeros(1)
"""
TIMING = Limits(cell_timeout=2.0, grace=0.5)
CALL_LIMIT = 1.0


@pytest.fixture(scope="module")
def timing_box():
    loop = asyncio.new_event_loop()
    client = LocalSandboxClient(TIMING)
    sandbox = loop.run_until_complete(client.create(CreateSandboxRequest(name="timing", docker_image="local")))
    yield loop, client, sandbox.id
    client.teardown()
    loop.close()


@pytest.mark.slow
@pytest.mark.rootless
@settings(max_examples=EXAMPLES, derandomize="PTENV_FUZZ_EXAMPLES" not in os.environ, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(imports=st.lists(STEP, max_size=3), calls=CALLS, level=st.sampled_from([1, 2]))
def test_a_caller_at_any_timing_ends_by_the_trials_deadline(timing_box, imports, calls, level):
    loop, client, sandbox_id = timing_box
    source = PROGRAM.replace("IMPORT", repr(imports)).replace("CALLS", repr(calls)).replace("{name}", SEGMENT_MEAN.name)
    cases = [args for _, args, _ in CASES.of(SEGMENT_MEAN, 3)]
    fields = requests.trial_fields(source, SEGMENT_MEAN.name, SEGMENT_MEAN.instance("intermediate", 3).inputs(), cases,
                                   SEGMENT_MEAN.allowlist(level), call_limit=CALL_LIMIT)
    timeout = requests.trial_timeout(TIMING, len(cases), CALL_LIMIT)
    start = loop.time()
    doc = loop.run_until_complete(client.call(sandbox_id, "trial", fields, timeout))
    assert loop.time() - start < timeout  # within the host's own wait, before any margin
    results, _ = requests.parse_trial_reply(doc, len(cases))  # a HarnessFault if the reply broke the protocol
    assert all(r.status in ("ok", "error", "died", "timeout", "invalid") for r in results)
    assert all(r.outputs is None or [o.tolist() for o in r.outputs] == [[0.0]] for r in results)


@pytest.mark.slow
@pytest.mark.rootless
async def test_f7_the_largest_trial_reply_costs_the_supervisor_less_than_a_hostile_reply_may(box):
    with open(f"/proc/{box.supervisor[0]}/status") as f:
        before = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    many = HiddenCases("trial-test-secret", MAX_HIDDEN_CASES).of(SEGMENT_MEAN, 3)
    n = HIDDEN_OUTPUT_CAP // 4 * 3 // 4  # float32 elements whose base64 is at the cap
    source = HEADER.replace("{name}", SEGMENT_MEAN.name) + f"    return tuple(torch.zeros({n}) for _ in range({MAX_HIDDEN_OUTPUTS}))\n"
    outcome = await play(box, source, cases=many)
    assert outcome.scoring_error is None and "returned 8 tensor(s)" in outcome.verdict.reason, outcome
    with open(f"/proc/{box.supervisor[0]}/status") as f:
        grew = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024 - before
    # 32 cases x 8 outputs x 128 KiB of base64 = 32 MiB held once; 64 MiB is what any hostile reply may cost.
    assert grew < 64, grew


# ---- F3 on the host, and the whole path of a rollout (end_session, the trial zygote)


@pytest.mark.parametrize("play_name", TRIAL_MESSAGES)
def test_f3_a_hostile_final_message_is_searched_in_linear_time_or_refused(play_name):
    message = TRIAL_MESSAGES[play_name]("f")
    if play_name == "F3_message_too_long":
        with pytest.raises(answer.MessageTooLong, match="at most 262,144"):
            answer.function_source(message, "f")
    else:  # 200,000 blanks after a fence: hours for a pattern that tries every split of them
        assert answer.function_source(message, "f").startswith("def f(")


@pytest.fixture(scope="module")
def zygote_transport():
    transport = transports.local(Limits(), tiers.allowlist_base())
    yield transport
    transport.client.teardown()


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.parametrize("level", [1, 2, 3])
async def test_a_rollouts_trial_ends_its_session_first_wherever_it_runs(zygote_transport, level):
    """The path env/rollout.py takes: the session ends (nothing the model left running survives it),
    then the trial runs, at level 2 in a fresh sandbox of the trial zygote."""
    transport = zygote_transport
    row = parse_row(SEGMENT_MEAN.instance("intermediate", 3, level).row(), "test row")
    box = await new_box(transport.client)
    leftover = "import threading, time\nthreading.Thread(target=time.sleep, args=(300,), daemon=True).start()\nprint('left')"
    assert (await box.cell(leftover)).stdout == "left\n"
    message = f"```python\n{SEGMENT_MEAN.by_hand}```"
    outcome = await assess_rollout(row, transport, box.id, final_message=message, draw=start_draw(row, CASES),
                                   partial_credit=False)
    assert (outcome.verdict.score, outcome.scoring_error) == (1.0, None), outcome.verdict.reason
    assert len(box.processes()) == 1  # the supervisor alone: the session and what it left running are gone
    await transport.client.delete(box.id)


# ---- through the real vf-eval


def trial_rows(path, level: int) -> int:
    """One function task per play of TRIAL_PLAYS (distinct families: distinct questions), in order."""
    rows = [i.row() for i in tiers.select(["intermediate"], "train", len(TRIAL_PLAYS), 0, "function", level)]
    path.write_text(dumps_rows(rows))
    return len(rows)


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.timeout(900)
@pytest.mark.parametrize("level", [1, 2, 3])
def test_vf_eval_scores_every_finding_in_the_trial_as_the_models_failure(tmp_path, level):
    count = trial_rows(tmp_path / "rows.jsonl", level)
    url, stop = serve_in_thread(tmp_path / "rows.jsonl")
    args = ["-a", json.dumps({"kind": "function", "tiers": "intermediate", "level": level, "num_train_examples": count}),
            "-n", str(count), "-r", "1", "-c", str(count)]
    try:
        _, rows = run_eval(url, "trial_hostile", args, tmp_path / "out")
    finally:
        stop()
    assert not leftover_sandboxes()
    played = {TRIAL_PLAYS[row["example_id"] % len(TRIAL_PLAYS)]: row for row in rows}
    assert set(played) == set(TRIAL_PLAYS), sorted(played)
    for name, row in played.items():
        where = f"{name}: {row['verdict']} {row['scoring_error']}"
        assert (row["reward"], row["scoring_error"], row["harness_error"]) == (0.0, None, 0.0), where
        assert reason(name, level) in row["verdict"]["reason"], where


def reason(play_name: str, level: int) -> str:
    """What a play's verdict says; at the efficiency level a graph of 8 outputs is over its own limit
    (its run replies with the cost after them)."""
    if play_name == "F7_largest_outputs" and level == efficiency.LEVEL:
        return "the graph returns 8 tensors; at most 7 are read"
    return TRIAL_REASONS[play_name]

