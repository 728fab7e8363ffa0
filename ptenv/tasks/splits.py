"""The split manifest: the row digest of every task of the default sets (seed 0) of every tier, so
that "the test split, seed 0" names the same tasks on every machine, and a change to a family
that changes a default set is seen (and named) rather than silently shipped.

`ptenv/tasks/splits.json` maps each set's name to its rows, in the order the set serves them:
[[task_id, row_digest], ...] (rows.row_digest: the row as posed, without its expected output).
The sets are every tier's train and test split, kind "result", and kind "function" at each level.
Its sha256 (short) is the split version, stamped into every rollout's `info["versions"]["splits"]`.

    python build_tasks.py --manifest   # (re)write it, after changing a family on purpose
    python build_tasks.py --verify     # and tests/test_splits.py: a fresh generation matches it
"""

import functools
import hashlib
import json
from pathlib import Path

from ptenv.tasks import tiers as tier_catalogue
from ptenv.tasks.functions import LEVELS
from ptenv.tasks.source import load_tasks

MANIFEST = Path(__file__).with_name("splits.json")


def set_names() -> list[tuple[str, dict]]:
    """(name, load_tasks keyword arguments) of every default set."""
    names = []
    for tier in tier_catalogue.TIERS:
        for split in tier_catalogue.SPLITS:
            names.append((f"result/{tier}/{split}", {"tiers": tier, "split": split}))
    for level in LEVELS:
        for tier, members in tier_catalogue.FUNCTION_TIERS.items():
            for split in tier_catalogue.SPLITS if members else ():
                names.append((f"function/level{level}/{tier}/{split}",
                              {"tiers": tier, "split": split, "kind": "function", "level": level}))
    return sorted(names)


def generate() -> dict[str, list[list[str]]]:
    """The manifest of a fresh generation: each default set as load_tasks serves it."""
    return {name: [[row.task_id, row.digest] for row in load_tasks(**kwargs)] for name, kwargs in set_names()}


def dumps(manifest: dict[str, list[list[str]]]) -> str:
    """Sorted by set name, one row per line, ASCII: byte-identical for the same sets, and diffable."""
    sets = []
    for name in sorted(manifest):
        rows = ",\n".join(f"  {json.dumps(row)}" for row in manifest[name])
        sets.append(f" {json.dumps(name)}: [\n{rows}\n ]")
    return "{\n" + ",\n".join(sets) + "\n}\n"


def write(path: Path | None = None) -> dict[str, list[list[str]]]:
    manifest = generate()
    (path or MANIFEST).write_text(dumps(manifest), encoding="ascii", newline="\n")
    return manifest


def load(path: Path | None = None) -> dict[str, list[list[str]]]:
    return json.loads((path or MANIFEST).read_text(encoding="ascii"))


@functools.cache
def split_version(path: Path | None = None) -> str:
    """The first 12 hex digits of the committed manifest's sha256; "missing" when it is not there."""
    try:
        return hashlib.sha256((path or MANIFEST).read_bytes()).hexdigest()[:12]
    except FileNotFoundError:
        return "missing"


def differences(committed: dict, fresh: dict) -> list[str]:
    """One line per difference, naming the set and the task: a row whose digest changed, a row
    added or gone, a set added or gone, or the same rows in another order."""
    lines = []
    for name in sorted(committed.keys() | fresh.keys()):
        if name not in fresh:
            lines.append(f"{name}: the set is gone")
            continue
        if name not in committed:
            lines.append(f"{name}: a new set of {len(fresh[name])} rows")
            continue
        old, new = dict(map(tuple, committed[name])), dict(map(tuple, fresh[name]))
        for task_id in sorted(old.keys() | new.keys()):
            if task_id not in new:
                lines.append(f"{name}: {task_id}: gone")
            elif task_id not in old:
                lines.append(f"{name}: {task_id}: new row {new[task_id]}")
            elif old[task_id] != new[task_id]:
                lines.append(f"{name}: {task_id}: row changed ({old[task_id]} -> {new[task_id]})")
        if old == new and [r[0] for r in committed[name]] != [r[0] for r in fresh[name]]:
            lines.append(f"{name}: the same rows in another order")
    return lines


def check(path: Path | None = None) -> list[str]:
    """The differences between the committed manifest and a fresh generation ([] when they match)."""
    path = path or MANIFEST
    if not path.exists():
        return [f"{path}: no manifest (python build_tasks.py --manifest writes it)"]
    return differences(load(path), generate())
