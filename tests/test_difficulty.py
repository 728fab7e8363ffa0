"""bench/difficulty.py through the real vf-eval: a long measurement stopped part-way goes on from
its --out directory without redoing a rollout, a run of other rows is never resumed into, and a
rollout of a row that changed since is redone."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600


def difficulty(out: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "bench/difficulty.py", "-m", "reference", "--tiers", "intermediate", "-r", "1",
               "-c", "2", "--out", str(out), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


def rollouts(out: Path) -> list[str]:
    (results,) = out.glob("intermediate/evals/*/*/results.jsonl")
    return results.read_text().splitlines()


@pytest.mark.slow
def test_a_stopped_measurement_goes_on_without_redoing_a_rollout(tmp_path):
    first = difficulty(tmp_path, "-n", "2", "--json", str(tmp_path / "first.json"))
    assert first.returncode == 0, first.stdout + first.stderr
    done = rollouts(tmp_path)
    assert len(done) == 2

    more = difficulty(tmp_path, "-n", "3", "--json", str(tmp_path / "more.json"))
    assert more.returncode == 0, more.stdout + more.stderr
    assert "--resume" in more.stdout
    now = rollouts(tmp_path)
    # Tool-call ids are random, so a redone rollout would not be byte-identical.
    assert len(now) == 3 and set(done) <= set(now)
    assert sorted(json.loads(line)["example_id"] for line in now) == [0, 1, 2]
    table = json.loads((tmp_path / "more.json").read_text())["tiers"]["intermediate"]
    assert table["prompts"] == 3 and table["pass@1"] == 1.0


@pytest.mark.slow
def test_a_run_of_other_rows_is_not_resumed(tmp_path):
    assert difficulty(tmp_path, "-n", "2").returncode == 0
    done = rollouts(tmp_path)
    for other in (["--seed", "1", "-n", "2"], ["-n", "1"], ["--split", "train", "-n", "2"]):
        refused = difficulty(tmp_path, *other)
        assert refused.returncode != 0
        assert "cannot resume it as" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert rollouts(tmp_path) == done


@pytest.mark.slow
def test_a_rollout_of_a_row_that_changed_since_is_redone(tmp_path):
    assert difficulty(tmp_path, "-n", "2").returncode == 0
    first, second = rollouts(tmp_path)
    assert json.loads(first)["info"]["row"] != json.loads(second)["info"]["row"]
    changed = json.loads(second)
    changed["info"]["row"] = "0" * 16  # as if the task had been fixed after this rollout
    (results,) = tmp_path.glob("intermediate/evals/*/*/results.jsonl")
    results.write_text(first + "\n" + json.dumps(changed) + "\n")

    again = difficulty(tmp_path, "-n", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "dropped 1 rollouts of rows that changed since" in again.stdout
    now = rollouts(tmp_path)
    assert len(now) == 2 and first in now
    assert {json.loads(line)["info"]["row"] for line in now} == {json.loads(first)["info"]["row"],
                                                                 json.loads(second)["info"]["row"]}


def test_a_row_rebuilt_on_another_cpu_keeps_its_digest():
    """Another CPU type computes some float32 outputs a last bit apart (a matmul's accumulation
    order), which must not make a resumed measurement redo the row; a change to what the task
    poses must."""
    import torch

    from ptenv.inside import codec
    from ptenv.tasks.rows import row_digest
    from ptenv.tasks.tiers import select

    row = select(["advanced"], "test", 1, 0)[0].row()
    expected = codec.decode(row["info"]["expected_output"])
    last_bit = torch.nextafter(expected, torch.full_like(expected, torch.inf))
    rebuilt = {**row, "info": {**row["info"], "expected_output": codec.encode(last_bit)}}
    assert rebuilt["info"]["expected_output"] != row["info"]["expected_output"]
    assert row_digest(rebuilt) == row_digest(row)

    posed = [{**row, "question": row["question"] + " "},
             {**row, "info": {**row["info"], "reference_solution": row["info"]["reference_solution"] + "\n"}},
             {**row, "info": {**row["info"], "inputs": row["info"]["inputs"][::-1]}}]
    assert len({row_digest(r) for r in posed} | {row_digest(row)}) == 4
