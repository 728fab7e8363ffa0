"""What build_tasks.py emits is exactly what the grader expects.

Every row of train.jsonl, decoded strictly: its expected output scores 1.0; its reference solution,
re-run the way a model's cell runs (row inputs preloaded, single-threaded) and read back through the
codec as the sandbox would send it, scores 1.0; and every degenerate answer scores 0.0.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from ptenv import codec
from ptenv.dataset import load_rows
from ptenv.grader import grade
from ptenv.session_ns import new_namespace

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("build_tasks", ROOT / "build_tasks.py")
build_tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_tasks)

ROWS = load_rows(ROOT / "train.jsonl")


@pytest.mark.parametrize("row", ROWS, ids=[row.task_id for row in ROWS])
def test_row_scores_one_for_its_answer_and_zero_for_degenerate_answers(row):
    assert grade(row.expected.clone(), row.expected).score == 1.0

    torch.set_num_threads(1)
    namespace = new_namespace(row.inputs)
    exec(row.reference_solution, namespace)
    sent_back = codec.decode(codec.encode(namespace["result"]))
    verdict = grade(sent_back, row.expected)
    assert verdict.score == 1.0, verdict.reason

    for name, answer in build_tasks.degenerate_answers(row.expected, row.inputs).items():
        verdict = grade(codec.decode(codec.encode(answer)), row.expected)
        assert verdict.score == 0.0, f"{name} passes: {verdict.reason}"
