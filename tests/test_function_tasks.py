"""Function tasks end to end: the answer rule, the trial's reply parser and verdict, the hidden
phase in a real sandbox (the reference passes, each wrong implementation fails with a reason, every
hostile answer scores 0.0 as the model's, never as a harness error), and the real vf-eval CLI."""

import base64
import json

import pytest
import torch

from ptenv.host import answer, requests
from ptenv.host.assess import assess_function, trial_verdict
from ptenv.host.requests import CaseResult, parse_trial_reply
from ptenv.host.blame import HarnessFault
from ptenv.inside import codec
from ptenv.tasks import tiers
from ptenv.tasks.fn_intermediate import MASKED_SOFTMAX, SEGMENT_MEAN
from ptenv.tasks.functions import HiddenCases
from tests.support.hostile_functions import ANSWERS, DIRECT_ONLY
from tests.support.policy_server import serve_in_thread
from tests.support.vf_eval import leftover_sandboxes, run_eval

# What the verdict of each hostile answer must say (any of these).
REASONS = {
    "hang": ["ran past the 5 s limit"],
    "sleep_past_the_limit": ["ran past the 5 s limit"],
    "kill_itself": ["killed by SIGKILL"],
    "exit_at_import": ["could not be loaded"],
    "exit_in_call": ["SystemExit"],
    "flood_output": ["shape", "ran past"],
    "fork": ["PermissionError"],
    "subprocess": ["PermissionError"],
    "memory_hog": ["allocate memory", "MiB of memory", "killed by SIGKILL"],
    "not_a_tensor": ["returned a float, not a torch.Tensor"],
    "liar_subclass": ["returned a Liar, not a torch.Tensor"],
    "meta_tensor": ["returned a meta tensor"],
    "huge_tensor": ["over the"],
    "patch_torch_at_import": ["shape", "values"],
    "patch_builtins_at_import": ["returned a int, not a torch.Tensor", "could not be loaded"],
    "forge_the_reply": ["shape", "values"],
    "write_the_channel": ["malformed reply"],
    "kill_the_supervisor": ["PermissionError", "shape", "values"],
    "look_for_hidden_inputs": ["shape"],
    "no_function": ["no ```python block defining `segment_mean`"],
    "syntax_error": ["could not be loaded: SyntaxError"],
    "huge_source": ["characters; at most 65536 are run"],
    "nul_in_source": ["could not be loaded"],
    "lone_surrogate_in_source": ["could not be loaded", "returned a str"],
}


# --- the answer rule ---------------------------------------------------------------------------


def test_the_answer_is_the_last_python_block_that_defines_the_function():
    first, last = "def f(x):\n    return x\n", "def f(x):\n    return x + 1\n"
    message = f"try\n```python\n{first}```\nthen\n```python\n{last}```\nand a test\n```python\nprint(f(1))\n```"
    assert answer.function_source(message, "f") == last
    assert answer.function_source("```\n" + first + "```", "f") == first  # no language tag
    assert answer.function_source("```python\ndef g(x): pass\n```", "f") is None
    assert answer.function_source("def f(x): return x", "f") is None  # not in a block
    assert answer.function_source([{"type": "text", "text": "```py\n" + first + "```"}], "f") == first
    assert answer.function_source(None, "f") is None
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "```python\n" + first + "```"},
                {"role": "tool", "content": "x"}, {"role": "assistant", "content": "done"}]
    assert answer.final_message(messages) == "done"  # only the final message counts


# --- the reply parser and the verdict -----------------------------------------------------------


def ok(*tensors):
    return {"status": "ok", "outputs": [codec.encode(t) for t in tensors]}


def test_the_reply_parser_takes_only_the_protocol():
    results, protected = parse_trial_reply({"load": None, "protected": True, "cases": [ok(torch.ones(2))]}, 1)
    assert protected and torch.equal(results[0].outputs[0], torch.ones(2))
    loaded = parse_trial_reply({"load": "SyntaxError: x", "protected": True, "cases": []}, 3)[0]
    assert [r.status for r in loaded] == ["error"] * 3 and "could not be loaded" in loaded[0].reason
    bad_tensor = {"status": "ok", "outputs": [{"dtype": "float32", "shape": [3], "data": "AAAA"}]}
    assert parse_trial_reply({"load": None, "protected": False, "cases": [bad_tensor]}, 1)[0][0].status == "invalid"
    for doc in ({}, {"load": None, "protected": True, "cases": []},
                {"load": None, "protected": True, "cases": [{"status": "ok", "outputs": []}]},
                {"load": None, "protected": "yes", "cases": [ok(torch.ones(1))]}, [1]):
        with pytest.raises(HarnessFault):
            parse_trial_reply(doc, 1)


def test_the_verdict_names_the_first_failing_case_and_counts_the_passes():
    expected = [[torch.ones(2)], [torch.zeros(3, dtype=torch.float64)], [torch.ones(1)]]
    results = [CaseResult([torch.ones(2)], "ok", ""), CaseResult([torch.zeros(3)], "ok", ""),
               CaseResult(None, "timeout", "ran past the 5 s limit")]
    verdict, fraction = trial_verdict(results, ["typical", "float64 input", "big"], expected, partial_credit=False)
    assert (verdict.score, verdict.outcome, fraction) == (0.0, "dtype", pytest.approx(1 / 3))
    assert verdict.reason.startswith("hidden case 2 of 3 (float64 input) failed: dtype torch.float32")
    partial, _ = trial_verdict(results, ["typical", "float64 input", "big"], expected, partial_credit=True)
    assert partial.score == pytest.approx(1 / 3)
    right = [CaseResult(e, "ok", "") for e in expected]
    assert trial_verdict(right, ["a", "b", "c"], expected, partial_credit=False)[0].score == 1.0


# --- the trial in a real sandbox ----------------------------------------------------------

CASES = HiddenCases("test-secret", 8)


async def trial(box, family, source, partial_credit=False, level=1):
    return await assess_function(box.client.call, box.id, source=source, name=family.name,
                                 inputs=family.instance("intermediate", 3).inputs(), cases=CASES.of(family, 3),
                                 allowlist=family.allowlist(level), limits=box.client.limits, partial_credit=partial_credit)


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.parametrize("family", [SEGMENT_MEAN, MASKED_SOFTMAX], ids=lambda f: f.id)
async def test_the_reference_passes_and_each_wrong_implementation_fails_with_its_case(box, family):
    outcome = await trial(box, family, family.reference)
    assert (outcome.verdict.score, outcome.hidden_pass_fraction, outcome.scoring_error) == (1.0, 1.0, None)
    assert outcome.verdict.reason == "all 8 hidden cases pass"
    names = {c.name for c in family.cases}
    for wrong, source in family.wrong.items():
        outcome = await trial(box, family, source, partial_credit=True)
        assert outcome.scoring_error is None, wrong
        assert outcome.verdict.score == outcome.hidden_pass_fraction < 1.0, wrong
        assert any(f"({name}) failed" in outcome.verdict.reason for name in names), outcome.verdict.reason
    assert (await box.cell("print('alive')")).stdout == "alive\n"  # a fresh session after the trials


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.parametrize("trick", [*ANSWERS, *DIRECT_ONLY])
async def test_a_hostile_answer_scores_zero_as_the_models_failure(box, trick):
    source = {**ANSWERS, **DIRECT_ONLY}[trick].replace("{name}", SEGMENT_MEAN.name)
    found = answer.function_source(f"```python\n{source}```", SEGMENT_MEAN.name)
    outcome = await trial(box, SEGMENT_MEAN, found)
    assert outcome.scoring_error is None
    assert outcome.verdict.score == 0.0 and outcome.hidden_pass_fraction == 0.0
    assert any(reason in outcome.verdict.reason for reason in REASONS[trick]), outcome.verdict.reason
    assert (await box.cell("print('alive')")).stdout == "alive\n"  # the sandbox still answers


# --- through the real vf-eval ---------------------------------------------------------------------


def function_rows(path, count: int) -> None:
    rows = [i.row() for i in tiers.select(["intermediate"], "train", count, 0, "function", 1)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vf_eval_grades_function_tasks_on_hidden_inputs(tmp_path):
    count = len(ANSWERS)
    function_rows(tmp_path / "rows.jsonl", count)
    url, stop = serve_in_thread(tmp_path / "rows.jsonl")
    args = ["-a", json.dumps({"kind": "function", "tiers": "intermediate", "num_train_examples": count}),
            "-n", str(count), "-r", "1", "-c", "8"]
    try:
        _, right = run_eval(url, "reference", args, tmp_path / "reference")
        _, hostile = run_eval(url, "function_hostile", args, tmp_path / "hostile")
    finally:
        stop()
    assert not leftover_sandboxes()
    assert len(right) == len(hostile) == count
    for row in right:
        assert (row["reward"], row["hidden_pass_fraction"], row["scoring_error"]) == (1.0, 1.0, None), row["verdict"]
    played = [(row["completion"][-1]["content"].split(":")[0].removeprefix("Playing "), row) for row in hostile]
    # Rows whose questions coincide share a position in the policy server, so a few tricks repeat.
    assert {trick for trick, _ in played} <= ANSWERS.keys() and len({trick for trick, _ in played}) >= count // 2
    for trick, row in played:
        where = f"{row['info']['task_id']} ({trick}): {row['verdict']}"
        assert (row["reward"], row["scoring_error"], row["harness_error"]) == (0.0, None, 0.0), where
        assert row["verdict"]["reason"].startswith(("hidden case", "no ```python block", "the answer's code block")), where


DUMPER = """
import os, threading, time
def grab(path, out):
    try:
        with open(path, "rb") as f:
            out.write(f.read(1 << 20))
    except OSError:
        pass
def dump():
    while True:
        with open("/tmp/dump", "ab") as out:
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    for name in ("cmdline", "environ", "mem"):
                        grab(f"/proc/{pid}/{name}", out)
            for root, dirs, files in os.walk("/tmp"):
                for name in files:
                    if name != "dump":
                        grab(os.path.join(root, name), out)
        time.sleep(0.01)
threading.Thread(target=dump, daemon=True).start()
print(os.getpid())
"""


@pytest.mark.slow
@pytest.mark.rootless
async def test_nothing_the_model_leaves_running_sees_the_hidden_inputs(box):
    """A thread the session leaves running keeps dumping everything it can read (every process's
    command line, environment and memory, the scratch directory): it is gone before the hidden
    inputs enter the sandbox, and nothing it wrote holds their bytes. (What a cell starts as a
    process is swept when the cell ends; a thread of the session lives on until the session does.)"""
    instance = SEGMENT_MEAN.instance("intermediate", 3)
    await requests.preload(box.client.call, box.id, instance.inputs(), timeout=60, limits=box.client.limits)
    reply = await box.cell(DUMPER)
    session = int(reply.stdout.split()[-1])
    cases = CASES.of(SEGMENT_MEAN, 3)
    outcome = await assess_function(box.client.call, box.id, source=SEGMENT_MEAN.reference, name=SEGMENT_MEAN.name,
                                    inputs=instance.inputs(), cases=cases, allowlist=None, limits=box.client.limits,
                                    partial_credit=False)
    assert outcome.verdict.score == 1.0
    gone = await box.cell(f"import os\ntry:\n    os.kill({session}, 0)\n    print('alive')\nexcept ProcessLookupError:\n"
                          f"    print('gone')\nprint(os.path.getsize('/tmp/dump'))")
    assert gone.stdout.split()[0] == "gone" and int(gone.stdout.split()[1]) > 0
    dump = await box.cell("import base64\nprint(base64.b64encode(open('/tmp/dump', 'rb').read()[-(8 << 20):]).decode())")
    seen = base64.b64decode(dump.stdout) if not dump.note else b""
    hidden = [t.numpy().tobytes() for _, args, _ in cases for t in args.values() if isinstance(t, torch.Tensor)
              and t.numel() * t.element_size() >= 16]
    assert hidden and not any(h in seen for h in hidden)
