"""The split manifest (ptenv/tasks/splits.json): a fresh generation of every default set matches
it row for row, a difference is named by set and task, and its hash, the split version, is
stamped into every rollout's versions."""

import hashlib
import json
import tomllib
from pathlib import Path

import pytest

import build_tasks
from ptenv.env.versions import versions
from ptenv.tasks import splits
from ptenv.tasks.rows import load_rows
from ptenv.tasks.source import BUNDLED

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh():
    return splits.generate()


def test_a_fresh_generation_of_every_default_set_matches_the_committed_manifest(fresh):
    changed = splits.differences(splits.load(), fresh)
    assert not changed, ("the default sets changed; if that is meant, run `python build_tasks.py --manifest` and add "
                         "a CHANGELOG line naming the rows:\n" + "\n".join(changed[:40]))


def test_the_manifest_covers_every_default_set_sorted_and_byte_stable(fresh):
    text = splits.MANIFEST.read_text(encoding="ascii")
    manifest = json.loads(text)
    assert list(manifest) == sorted(manifest) == [name for name, _ in splits.set_names()]
    assert text == splits.dumps(manifest) == splits.dumps(fresh)
    assert {"result/basic/train", "result/expert/test", "function/level1/basic/train", "function/level2/expert/test"} \
        <= set(manifest)
    for name, rows in manifest.items():
        assert rows and all(len(row) == 2 and len(row[1]) == 16 for row in rows), name
        assert len({task_id for task_id, _ in rows}) == len(rows), f"{name}: a task twice"
    # The canonical 45 are the basic train set, as the bundled train.jsonl poses them.
    assert manifest["result/basic/train"] == [[row.task_id, row.digest] for row in load_rows(BUNDLED)]
    assert len(manifest["result/intermediate/train"]) == 170 and len(manifest["result/expert/test"]) == 75


def test_differences_name_each_changed_row_by_set_and_task():
    committed = {"result/x/test": [["a/b@1", "1" * 16], ["a/c@1", "2" * 16]], "result/y/test": [["a/d@1", "3" * 16]]}
    assert splits.differences(committed, committed) == []
    fresh = {"result/x/test": [["a/b@1", "1" * 16], ["a/c@1", "9" * 16], ["a/e@1", "4" * 16]],
             "result/z/test": [["a/f@1", "5" * 16]]}
    assert splits.differences(committed, fresh) == [
        f"result/x/test: a/c@1: row changed ({'2' * 16} -> {'9' * 16})",
        f"result/x/test: a/e@1: new row {'4' * 16}",
        "result/y/test: the set is gone",
        "result/z/test: a new set of 1 rows",
    ]
    reordered = {"result/x/test": committed["result/x/test"][::-1], "result/y/test": committed["result/y/test"]}
    assert splits.differences(committed, reordered) == ["result/x/test: the same rows in another order"]


def test_the_build_check_names_a_changed_row_and_fails(fresh, tmp_path, monkeypatch, capsys):
    tampered = json.loads(json.dumps(fresh))
    task_id, digest = tampered["result/expert/test"][3]
    tampered["result/expert/test"][3][1] = "0" * 16
    path = tmp_path / "splits.json"
    path.write_text(splits.dumps(tampered), encoding="ascii")
    monkeypatch.setattr(splits, "MANIFEST", path)
    monkeypatch.setattr(splits, "generate", lambda: fresh)
    assert not build_tasks.verify_manifest()
    assert f"FAIL manifest result/expert/test: {task_id}: row changed ({'0' * 16} -> {digest})" \
        in capsys.readouterr().out.splitlines()
    path.write_text(splits.dumps(fresh), encoding="ascii")
    assert build_tasks.verify_manifest()
    assert capsys.readouterr().out.startswith("ok   split manifest splits.json")


def test_the_split_version_is_the_manifests_short_sha256_and_is_in_every_versions_stamp():
    version = hashlib.sha256(splits.MANIFEST.read_bytes()).hexdigest()[:12]
    assert splits.split_version() == version
    assert versions()["splits"] == version


def test_the_manifest_ships_in_the_wheel():
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["include"]
    assert str(splits.MANIFEST.relative_to(ROOT)) in include


def test_a_classic_rollouts_info_carries_the_split_version():
    from ptenv.env.classic import as_dataset
    from ptenv.tasks.source import load_tasks

    info = json.loads(as_dataset(load_tasks()[:2])[0]["info"])
    assert info["versions"]["splits"] == splits.split_version()
