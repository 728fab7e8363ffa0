"""Where tasks come from: the bundled train.jsonl for the default dataset, the Hugging Face hub for forks."""

import json
from pathlib import Path

from ptenv.dataset import RowError, TaskRow, load_rows, parse_row

DEFAULT_DATASET = "eltociear/pytorch-tasks-v1"
# Beside pytorch_env.py, in the repo and in an installed wheel alike.
BUNDLED = Path(__file__).resolve().parent.parent / "train.jsonl"


def load_tasks(dataset_name: str = DEFAULT_DATASET, split: str = "train") -> list[TaskRow]:
    """The tasks of one split, parsed strictly; a bad row fails with one line naming it."""
    if dataset_name == DEFAULT_DATASET:
        if split != "train":
            raise ValueError(f"split {split!r} is not in {dataset_name} (it has: train)")
        return load_rows(BUNDLED)
    return _load_from_hub(dataset_name, split)


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
