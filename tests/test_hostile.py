"""The hostile scripted policy through the real vf-eval CLI: every trick (busy loops, fork and
memory bombs, floods, answer-key theft, network, killing the session, tensor subclasses, meta
tensors, wrong dtypes and broadcastable shapes, patched torch / builtins / encoder, forged protocol
frames) scores 0.0, the run completes, the host stays healthy and nothing of the run is left.

Every outcome is the model's, so none sets scoring_error: a cell that kills or breaks its own
session gets the session restarted (fresh namespace, inputs preloaded), and its answer is missing.
"""

import json
import os
import urllib.request
from pathlib import Path

import pytest

from tests.support.hostile import CANARY, REPO, TRICKS
from tests.support.policy_server import serve_in_thread
from tests.support.vf_eval import leftover_sandboxes, run_eval

pytestmark = [pytest.mark.slow, pytest.mark.rootless]

NO_RESULT = (0.0, 0.0, 0.0, 0.0)  # result_present, shape_match, dtype_match, values_match
INVALID = (1.0, 0.0, 0.0, 0.0)
WRONG_VALUES = (1.0, 1.0, 1.0, 0.0)
WRONG_SHAPE = (1.0, 0.0, 1.0, 0.0)
WRONG_DTYPE = (1.0, 1.0, 0.0, 0.0)
# How each trick must end (the grading probes exactly; the others at least without an answer),
# and what the tool reply must tell the model (any of these; the time limit may come first on a
# busy machine).
TIMED_OUT = "stopped after the 30 s time limit"
EXPECTED = {
    "busy_loop": (NO_RESULT, [TIMED_OUT]),
    "spin_ignoring_the_alarm": (NO_RESULT, ["time limit and the session was restarted"]),
    "fork_bomb": (NO_RESULT, ["Resource temporarily unavailable", TIMED_OUT]),
    "shell_fork_bomb": (NO_RESULT, []),  # its children print after the cell; the sweep kills them
    "memory_bomb": (NO_RESULT, ["allocate", "MiB of memory", TIMED_OUT]),
    "print_flood": (NO_RESULT, ["more bytes of stdout were cut"]),
    "fill_the_disk": (NO_RESULT, ["No space left on device", TIMED_OUT]),
    "steal_the_answer_key": (NO_RESULT, []),
    "call_the_network": (NO_RESULT, ["no network"]),
    "kill_everything": (NO_RESULT, ["killed by SIGKILL and was restarted"]),
    "exit_hard": (NO_RESULT, ["exited with code 0 and was restarted"]),
    "exit_with_success": (WRONG_VALUES, ["SystemExit"]),
    "liar_subclass": (INVALID, []),
    "meta_tensor": (INVALID, []),
    "extra_leading_dim": (WRONG_SHAPE, []),
    "wrong_dtype": (WRONG_DTYPE, []),
    "one_element": (WRONG_SHAPE, []),
    "replace_torch": (WRONG_VALUES, []),
    "delete_result": (NO_RESULT, []),
    "patch_builtins": (None, []),  # no result or an invalid one, depending on what breaks first
    "forge_the_encoder": (WRONG_VALUES, []),
    "inject_protocol_frames": (None, []),  # a forged frame is read back, or the session restarts
    "escape_the_filesystem": (NO_RESULT, []),
    "background_daemon": (WRONG_VALUES, []),
    "spoof_the_reward": (NO_RESULT, ["PASSED"]),
    # Rootless, the kernel accepts the signal and PID 1, which has no handler for it, never gets it.
    "interrupt_the_supervisor": (WRONG_VALUES, ["PermissionError"] if os.geteuid() == 0 else []),
    "starve_the_supervisor": (WRONG_VALUES, ["PermissionError"]),
    "huge_type_name": (INVALID, []),
    "wide_output": (WRONG_VALUES, ["ValueError"]),
    "nested_reply": (INVALID, []),
    "trickle_the_reply": (INVALID, []),
    "json_bomb_reply": (INVALID, []),
}
# What the verdict must say of the tricks that go for the read-back.
REASONS = {
    "huge_type_name": "not a torch.Tensor",
    "nested_reply": "is not JSON",
    "trickle_the_reply": "did not finish its reply within the time limit",
    "json_bomb_reply": "sent an oversized reply",
}
HOST_DIRS = [REPO, Path("/work"), Path("/root"), Path("/tmp"), Path("/var/tmp")]


def tool_reply(row: dict) -> str:
    return "\n".join(m["content"] for m in row["completion"] if m["role"] == "tool")


def played(row: dict) -> str:
    return row["completion"][-1]["content"].removeprefix("Played ").rstrip(".")


@pytest.mark.timeout(600)
def test_hostile_policy_scores_zero_and_leaves_the_host_healthy(tmp_path):
    assert EXPECTED.keys() == TRICKS.keys()
    url, stop = serve_in_thread()
    try:
        _, rows = run_eval(url, "hostile", ["-n", "45", "-r", "1", "-c", "45"], tmp_path)
        with urllib.request.urlopen(url + "/models", timeout=10) as response:  # the host still answers
            assert "hostile" in {m["id"] for m in json.load(response)["data"]}
    finally:
        stop()
    assert not leftover_sandboxes()
    assert not [d for d in HOST_DIRS if (d / CANARY).exists()]

    assert len(rows) == 45
    assert {played(r) for r in rows} == TRICKS.keys()
    for row in rows:
        trick, reply = played(row), tool_reply(row)
        where = f"{row['info']['task_id']} ({trick}): {reply[-300:]!r}"
        assert row["reward"] == 0.0, where
        assert row["scoring_error"] is None, where
        assert row["harness_error"] == 0.0, where
        metrics = tuple(row[k] for k in ("result_present", "shape_match", "dtype_match", "values_match"))
        outcome, notes = EXPECTED[trick]
        assert outcome is None or metrics == outcome, where
        assert metrics != (1.0, 1.0, 1.0, 1.0), where
        assert not notes or any(note in reply for note in notes), where
        assert "stole the answer" not in reply and "ran the reference solution" not in reply, where
        assert trick not in REASONS or REASONS[trick] in row["verdict"]["reason"], (where, row["verdict"])
