"""Nothing of one rollout's trial is worth anything to another (issue 35): the page-cache and the
record-lock channels replayed through the real vf-eval (tests/support/cross_rollout.py). Two
rollouts of one prompt: the writer's answer sends each of its hidden cases through the channel
from its trial; the reader decodes them in its session, computes their outputs there, and answers
with the lookup table. The channel carries the cases whole (the reader's table has every one), and
the reader still scores 0.0, as its own failure: every rollout is graded on cases drawn for it
alone. The 0.4 line's runs are in tests/test_v1_env.py."""

import json

import pytest

from ptenv.tasks.tiers import select
from tests.support.cross_rollout import SLOTS, clear_page_cache
from tests.support.policy_server import serve_in_thread
from tests.support.vf_eval import leftover_sandboxes, run_eval

# The basic function tier's first row at level 2 (its family's cases are small enough for the channel).
ROW = select(["basic"], "train", 1, 0, "function", 2)[0]
ROLLOUTS = 2  # the writer and the reader (its cell waits for the writer's last case)
CHANNELS = ["page_cache", "locks"]


def the_table(completion: list[dict]) -> dict:
    """The reader's table, from its cell's reply (what the channel carried)."""
    reply = next(m["content"] for m in completion if m["role"] == "tool" and "TABLE=" in str(m["content"]))
    return json.loads(reply.split("TABLE=", 1)[1].split("\n", 1)[0])


def check_rollouts(rows: list[tuple[list[dict], dict, float, str | None]]) -> None:
    """(completion, verdict, reward, scoring error) per rollout, writers and readers alike 0.0 as the
    model's failure; every reader read a whole set of cases and missed with its own."""
    readers = 0
    for completion, verdict, reward, error in rows:
        assert (reward, error) == (0.0, None), verdict
        if [m for m in completion if m["role"] == "assistant"][-1]["content"].startswith("Writer"):
            continue  # it failed its cases (the locks' writer by its time limit)
        readers += 1
        assert len(the_table(completion)) == SLOTS, "the channel did not carry the writer's cases"
        assert "KeyError" in verdict["reason"], verdict  # its table has none of the cases it was graded on
    assert readers == 1


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.timeout(900)
@pytest.mark.parametrize("channel", CHANNELS)
def test_vf_eval_a_channel_carries_a_writers_cases_and_the_reader_gains_nothing(tmp_path, channel):
    (tmp_path / "rows.jsonl").write_text(json.dumps(ROW.row()) + "\n")
    clear_page_cache()
    url, stop = serve_in_thread(tmp_path / "rows.jsonl")
    args = ["-a", json.dumps({"kind": "function", "level": 2, "tiers": "basic", "num_train_examples": 1}),
            "-n", "1", "-r", str(ROLLOUTS), "-c", str(ROLLOUTS)]
    try:
        _, results = run_eval(url, f"cross_rollout_{channel}", args, tmp_path / "out")
    finally:
        stop()
    assert not leftover_sandboxes()
    assert len(results) == ROLLOUTS and {row["info"]["task_id"] for row in results} == {ROW.id}
    check_rollouts([(row["completion"], row["verdict"], row["reward"], row["scoring_error"]) for row in results])
