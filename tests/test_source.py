"""Where tasks come from: the bundled copy for the default name (offline), `datasets` for a fork,
and a one-line error naming the split or row that is wrong."""

import json
import shutil
from pathlib import Path

import pytest

import pytorch_env
from ptenv.tasks.rows import RowError
from ptenv.tasks.source import BUNDLED, DEFAULT_DATASET, load_tasks


def test_the_default_dataset_is_the_bundled_copy(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network is touched for the default name
    tasks = load_tasks(DEFAULT_DATASET, "train")
    assert len(tasks) == 45
    assert [t.question for t in tasks] == [json.loads(line)["question"] for line in BUNDLED.read_text().splitlines()]


def test_a_missing_split_of_the_default_dataset_is_one_line():
    with pytest.raises(ValueError, match=r"^split must be 'train' or 'test', got 'validation'$"):
        load_tasks(DEFAULT_DATASET, "validation")


def test_load_environment_serves_the_held_out_split_as_the_eval_dataset():
    env = pytorch_env.load_environment()
    try:  # the defaults: the 45 canonical tasks and no eval dataset, as before
        assert [json.loads(r["info"])["task_id"] for r in env.get_dataset()] == [t.task_id for t in load_tasks()]
        assert env.eval_dataset is None
    finally:
        env.sandbox_client.teardown()
    env = pytorch_env.load_environment(tiers=["intermediate", "advanced", "expert"], num_train_examples=6,
                                       num_eval_examples=4, seed=2)
    try:
        train = [json.loads(r["info"]) for r in env.get_dataset()]
        test = [json.loads(r["info"]) for r in env.get_eval_dataset()]
        assert len(train) == 6 and len(test) == 4
        assert {i["seed"] % 2 for i in train} == {0} and {i["seed"] % 2 for i in test} == {1}
        assert all(i["task_id"] == f"{i['family']}@{i['seed']}" and i["tier"] in ("intermediate", "advanced", "expert")
                   for i in train + test)
        assert {i["task_id"] for i in train + test} <= set(env.tasks)  # the host holds both splits' answers
    finally:
        env.sandbox_client.teardown()


def test_a_bad_environment_argument_is_one_line():
    with pytest.raises(ValueError, match=r"^num_eval_examples must be 0 \(no eval dataset\), -1 \(the default set\)"):
        pytorch_env.load_environment(num_eval_examples="all")


def fork(tmp_path: Path, rows: list[dict] | None = None) -> str:
    """A fork of the dataset as `datasets` sees a hub repository: a folder with train.jsonl."""
    folder = tmp_path / "fork"
    folder.mkdir()
    if rows is None:
        shutil.copy(BUNDLED, folder / "train.jsonl")
    else:
        (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_a_fork_loads_through_datasets(tmp_path):
    tasks = load_tasks(fork(tmp_path), "train")
    assert [t.task_id for t in tasks] == [t.task_id for t in load_tasks()]
    assert all(a.expected.dtype == b.expected.dtype for a, b in zip(tasks, load_tasks()))


def test_a_missing_split_of_a_fork_is_one_line(tmp_path):
    with pytest.raises(ValueError) as e:
        load_tasks(fork(tmp_path), "validation")
    assert "cannot load split 'validation'" in str(e.value) and "\n" not in str(e.value)


def test_a_malformed_row_of_a_fork_names_the_row_and_the_field(tmp_path):
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()[:3]]
    rows[2]["info"]["expected_output"]["dtype"] = "float128"
    name = fork(tmp_path, rows)
    with pytest.raises(RowError) as e:
        load_tasks(name, "train")
    assert str(e.value) == f"{name}[train] row 2: info.expected_output: unknown dtype 'float128'"


def test_a_fork_whose_info_is_broken_json_names_the_row(tmp_path):
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()[:2]]
    rows = [{**r, "info": json.dumps(r["info"])} for r in rows]
    rows[1]["info"] = rows[1]["info"][:-5]
    name = fork(tmp_path, rows)
    with pytest.raises(RowError, match=rf"^{name}\[train\] row 1: info: not valid JSON: "):
        load_tasks(name, "train")


def test_an_unknown_sandbox_is_one_line():
    with pytest.raises(ValueError, match=r"^unknown sandbox 'docker': choose one of \['local', 'prime'\]$"):
        pytorch_env.load_environment(sandbox="docker")
