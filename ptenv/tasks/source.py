"""Where tasks come from: the bundled train.jsonl for the default dataset's canonical tasks, the task
families for every other instance of it (generated on the fly, deterministically), and the Hugging
Face hub for forks."""

import json
from pathlib import Path

from ptenv.tasks import tiers as tier_catalogue
from ptenv.tasks.host_state import reference_run
from ptenv.tasks.rows import RowError, TaskRow, load_rows, parse_row

DEFAULT_DATASET = "eltociear/pytorch-tasks-v1"
# Beside pytorch_env.py, in the repo and in an installed wheel alike.
BUNDLED = Path(__file__).resolve().parents[2] / "train.jsonl"


def load_tasks(dataset_name: str = DEFAULT_DATASET, split: str = "train", tiers="basic",
               num_examples: int = -1, seed: int = 0, num_name: str = "num_train_examples",
               kind: str = "result", level: int = 1, families=None) -> list[TaskRow]:
    """The tasks of one split, parsed strictly; a bad row or argument fails with one line naming it."""
    if dataset_name != DEFAULT_DATASET:
        if tiers not in ("basic", ["basic"]) or (num_examples, seed, kind, families) != (-1, 0, "result", None):
            raise ValueError("tiers, families, kind, num_train_examples, num_eval_examples and seed choose generated tasks of "
                             f"{DEFAULT_DATASET}; a fork ({dataset_name}) serves its own rows")
        return _load_from_hub(dataset_name, split)
    names = tier_catalogue.parse_tiers(tiers)
    tier_catalogue.check_arguments(split, num_examples, seed, num_name)
    tier_catalogue.check_kind(kind, level, names)
    chosen = tier_catalogue.parse_families(families, names, split, kind, level)
    canonical = {row.task_id: row for row in load_rows(BUNDLED)} if kind == "result" else {}
    with reference_run():  # tasks are built as the sandbox runs them, and the host's torch left as it was
        return [canonical[i.id] if i.seed is None else parse_row(i.row(), i.id)
                for i in tier_catalogue.select(names, split, num_examples, seed, kind, level, chosen)]


def _load_from_hub(dataset_name: str, split: str) -> list[TaskRow]:
    from datasets import load_dataset  # heavy, and only forks need it

    try:
        rows = load_dataset(dataset_name, split=split)
    except ValueError as e:  # datasets says "Unknown split ..." as a ValueError
        raise ValueError(f"{dataset_name}: cannot load split {split!r}: {str(e).splitlines()[0]}") from None
    tasks = []
    for i, row in enumerate(rows):
        where = f"{dataset_name}[{split}] row {i}"
        if isinstance(row.get("info"), str):  # hub copies may keep info as a JSON string
            try:
                row = {**row, "info": json.loads(row["info"])}
            except ValueError as e:
                raise RowError(f"{where}: info: not valid JSON: {e}") from None
        tasks.append(parse_row(row, where))
    return tasks
