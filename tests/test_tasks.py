"""The catalogue, the dataset built from it, the --verify gate and the strict row loader."""

import copy
import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from ptenv import codec
from ptenv.dataset import RowError, build_inputs, build_row, dumps_rows, load_rows, parse_row, run_reference
from ptenv.grader import grade
from ptenv.session_ns import new_namespace
from ptenv.tasks import CATEGORIES, TASKS, Task

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "train.jsonl"
_spec = importlib.util.spec_from_file_location("build_tasks", ROOT / "build_tasks.py")
build_tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_tasks)

# Every topic of the spec's "Task Categories" table, and the tasks that cover it.
TOPICS = {
    "tensor_ops": {
        "reshape": ["reshape_blocks"], "transpose": ["transpose_dims"],
        "reductions": ["row_sum_keepdim", "column_std_unbiased", "row_argmax"], "clamp": ["clamp_range"],
        "masking": ["masked_fill", "masked_select", "band_mask"], "sort/argsort": ["sort_descending", "argsort_rows"],
        "cat/stack": ["stack_then_cat"], "matmul": ["batched_matmul"], "normalise": ["normalise_rows"],
        "cumsum": ["cumsum_rows"], "dtype cast": ["cast_trunc_int32", "band_mask"],
    },
    "nn_modules": {
        "Linear with explicit weights": ["linear_explicit", "mlp_relu_sigmoid", "flatten_linear"],
        "Conv2d with explicit weights": ["conv2d_padding", "conv2d_stride"],
        "relu": ["mlp_relu_sigmoid"], "gelu": ["gelu_exact"], "sigmoid": ["mlp_relu_sigmoid"],
        "softmax": ["softmax_columns"], "log_softmax": ["log_softmax_rows"], "LayerNorm": ["layer_norm_affine"],
        "pooling": ["max_pool", "avg_pool"], "flatten": ["flatten_linear"], "Embedding": ["embedding_lookup"],
    },
    "autograd": {
        "backward on scalar losses": ["scalar_backward", "grad_accumulates"],
        "torch.autograd.grad": ["vector_jacobian", "detach_target"], "detach semantics": ["detach_target"],
        "second derivatives via create_graph": ["second_derivative", "gradient_penalty"],
    },
    "losses": {
        "MSE": ["mse_mean_grad"], "cross-entropy (mean)": ["cross_entropy_mean"],
        "cross-entropy (per-sample)": ["cross_entropy_per_sample"], "BCE": ["bce_with_logits"],
        "L1": ["l1_per_sample"], "smooth L1": ["smooth_l1"],
    },
    "optim": {
        "one SGD step": ["sgd_step"], "SGD+momentum": ["sgd_momentum"], "one Adam step": ["adam_step"],
        "three chained steps": ["adamw_three_steps"], "clip_grad_norm_": ["clip_grad_norm"],
    },
}


def test_catalogue_has_the_spec_counts_and_well_formed_unique_ids():
    assert len(TASKS) == 45
    assert Counter(task.category for task in TASKS) == CATEGORIES
    ids = [task.id for task in TASKS]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"(tensor_ops|nn_modules|autograd|losses|optim)/[a-z0-9_]+", i) for i in ids)


def test_every_spec_topic_is_covered_and_every_task_has_a_topic():
    ids = {task.id for task in TASKS}
    covered = set()
    for category, topics in TOPICS.items():
        for topic, names in topics.items():
            assert names, topic
            for name in names:
                assert f"{category}/{name}" in ids, f"{topic}: no task {category}/{name}"
                covered.add(f"{category}/{name}")
    assert covered == ids


def test_inputs_are_built_without_randomness_or_initialisers():
    # Only arange/linspace/tensor constants and arithmetic on them; the layers get these as weights.
    allowed = {"torch.arange(", "torch.linspace(", "torch.tensor(", ".reshape(", ".to("}
    for task in TASKS:
        for source in task.inputs.values():
            calls = set(re.findall(r"[A-Za-z_.]*\(", source)) - {"("}
            assert calls <= allowed, (task.id, calls - allowed)


def test_train_jsonl_equals_a_fresh_build_and_the_cli_build_is_byte_identical(tmp_path):
    fresh = dumps_rows([build_row(task) for task in TASKS])
    committed = TRAIN.read_bytes()
    assert fresh.encode("ascii") == committed, "train.jsonl is stale: run python build_tasks.py --out train.jsonl"
    out = tmp_path / "again.jsonl"
    subprocess.run([sys.executable, str(ROOT / "build_tasks.py"), "--out", str(out)], check=True, cwd=tmp_path,
                   capture_output=True, timeout=120)
    assert out.read_bytes() == committed


def test_questions_state_every_input_and_the_exact_result_dtype_and_shape():
    for row in load_rows(TRAIN):
        for name, tensor in row.inputs.items():
            assert f"- `{name}`: {tensor.dtype}, shape {tuple(tensor.shape)}" in row.question, row.task_id
        assert (f"`result`. It must be a torch.Tensor with dtype {row.expected.dtype} "
                f"and shape {tuple(row.expected.shape)}.") in row.question, row.task_id


def test_verify_cli_passes_every_task():
    proc = subprocess.run([sys.executable, str(ROOT / "build_tasks.py"), "--verify"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines) == 46 and all(line.startswith("ok   ") for line in lines[:-1])
    assert lines[-1].startswith("45 tasks: 45 passed, 0 failed")


def synthetic(solution, x="torch.linspace(-1.0, 1.0, 7)", **degenerate_ok):
    return Task("nn_modules/synthetic", "synthetic", {"x": x}, solution, degenerate_ok)


@pytest.mark.parametrize("task, check, detail", [
    (synthetic("result = torch.relu(x)\n", x="torch.linspace(0.1, 1.0, 7)"), "degenerate", "input:x"),
    (synthetic("result = x.clone()\n"), "non_identity", "answer equals input x"),
    (synthetic("result = (x * 2.0 + 1.0).to(torch.float64)\n", x="torch.arange(6.0)"), "degenerate", "float16"),
    (synthetic("result = (x * x).sum()\n"), "degenerate", "mean"),
    (synthetic("result = x * 0\n"), "degenerate", "zeros"),
    (synthetic("result = x + torch.rand(7)\n"), "deterministic", "second run differs"),
    (synthetic("result = x / 0.0\n"), "finite", "NaN or inf"),
    (synthetic("result = x[x > 5]\n"), "non_empty", "no elements"),
    (synthetic("result = x.tolist()\n"), "tensor", "expected a torch.Tensor, got list"),
    (synthetic("result = x.to(torch.complex64) * 1j\n"), "tensor", "complex"),
    (synthetic("y = x + 1\n"), "runs", "left no `result`"),
    (synthetic("result = x @ torch.ones(3)\n"), "runs", "RuntimeError"),
    (synthetic("result = torch.tanh(x)\n", **{"input:x": "stale"}), "degenerate", "degenerate_ok lists input:x"),
])
def test_verify_catches_bad_tasks(task, check, detail):
    results = {c.name: c for c in build_tasks.check_task(task)}
    assert not results[check].ok and detail in results[check].detail


def test_a_justified_exception_lets_the_named_degenerate_answer_through_only():
    within_tolerance = synthetic("result = x * 1.000001\n")
    assert [c.detail for c in build_tasks.check_task(within_tolerance) if not c.ok] == ["grader accepts input:x"]
    excused = synthetic("result = x * 1.000001\n", **{"input:x": "a scale within tolerance, for this test"})
    assert all(c.ok for c in build_tasks.check_task(excused))


# Plausible mistakes a model makes; each must fail, so the tasks test the skill they name.
NEAR_MISSES = {
    "tensor_ops/column_std_unbiased": "result = x.std(dim=0, correction=0)",
    "tensor_ops/band_mask": "result = (x > -0.5) & (x <= 1.0)",
    "tensor_ops/cast_trunc_int32": "result = x.floor().to(torch.int32)",
    "nn_modules/gelu_exact": "result = torch.nn.functional.gelu(x, approximate='tanh')",
    "nn_modules/avg_pool": "result = torch.nn.functional.avg_pool2d(x, 3, 2, 1, count_include_pad=False)",
    "nn_modules/mlp_relu_sigmoid": "result = torch.sigmoid((x @ w1.T + b1) @ w2.T + b2)",
    "autograd/detach_target": "x.requires_grad_()\n(result,) = torch.autograd.grad(((x - x ** 2) ** 2).sum(), x)",
    "autograd/gradient_penalty": "w.requires_grad_()\n(result,) = torch.autograd.grad(torch.tanh(x @ w).sum(), w)",
    "losses/mse_mean_grad": "result = 2 * (pred - target)",
    "losses/bce_with_logits": "result = torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction='none')",
    "optim/sgd_momentum": "w = torch.nn.Parameter(w)\nopt = torch.optim.SGD([w], lr=0.1, momentum=0.9)\n"
                          "for _ in range(2):\n    ((x @ w.T - y) ** 2).mean().backward()\n    opt.step()\nresult = w.detach()",
    "optim/clip_grad_norm": "w, b = torch.nn.Parameter(w), torch.nn.Parameter(b)\n((x @ w.T + b - y) ** 2).sum().backward()\n"
                            "result = torch.cat([w.grad.flatten(), b.grad])",
}


@pytest.mark.parametrize("task_id", NEAR_MISSES)
def test_near_miss_solutions_fail(task_id):
    task = next(task for task in TASKS if task.id == task_id)
    namespace = new_namespace(build_inputs(task))
    exec(NEAR_MISSES[task_id], namespace)
    answer = codec.decode(codec.encode(namespace["result"]))
    assert grade(answer, run_reference(task).detach()).score == 0.0


def good_row() -> dict:
    return json.loads(TRAIN.read_text().splitlines()[0])


def broken(edit) -> dict:
    row = copy.deepcopy(good_row())
    edit(row)
    return row


@pytest.mark.parametrize("row, field, problem", [
    ([], "row", "expected an object, got []"),
    (broken(lambda r: r.pop("question")), "row", "missing ['question']"),
    (broken(lambda r: r.update(answer="x")), "row", "unexpected ['answer']"),
    (broken(lambda r: r.update(question="  ")), "question", "non-empty string"),
    (broken(lambda r: r.update(info="{}")), "info", "expected an object"),
    (broken(lambda r: r["info"].pop("expected_output")), "info", "missing ['expected_output']"),
    (broken(lambda r: r["info"].update(task_id="reshape")), "info.task_id", "not of the form category/short_name"),
    (broken(lambda r: r["info"].update(category="vision")), "info.category", "unknown category 'vision'"),
    (broken(lambda r: r["info"].update(category="optim")), "info.task_id", "does not start with its category 'optim'"),
    (broken(lambda r: r["info"].update(inputs=[])), "info.inputs", "non-empty list"),
    (broken(lambda r: r["info"]["inputs"][0].update(name="result")), "info.inputs[0].name", "not a usable variable name"),
    (broken(lambda r: r["info"]["inputs"][0].update(name="x y")), "info.inputs[0].name", "not a usable variable name"),
    (broken(lambda r: r["info"]["inputs"].append(r["info"]["inputs"][0])), "info.inputs[1].name", "duplicate input 'x'"),
    (broken(lambda r: r["info"]["inputs"][0]["tensor"].update(dtype="float8")), "info.inputs[0].tensor", "unknown dtype"),
    (broken(lambda r: r["info"]["expected_output"].update(shape=[30])), "info.expected_output", "data has 96 bytes, shape [30] of float32 needs 120"),
    (broken(lambda r: r["info"]["expected_output"].update(data="@@@@")), "info.expected_output", "not valid base64"),
    (broken(lambda r: r["info"].update(expected_output=codec.encode(torch.tensor([1.0, float("nan")])))),
     "info.expected_output", "real, non-empty and finite"),
    (broken(lambda r: r["info"].update(expected_output=codec.encode(torch.zeros(0)))),
     "info.expected_output", "real, non-empty and finite"),
    (broken(lambda r: r["info"].update(reference_solution="result = (")), "info.reference_solution", "not valid Python"),
])
def test_malformed_rows_give_one_line_errors_naming_row_and_field(row, field, problem):
    with pytest.raises(RowError) as err:
        parse_row(row, "row 7")
    message = str(err.value)
    assert message.startswith(f"row 7: {field}: ") and problem in message and "\n" not in message


def test_load_rows_names_file_and_line(tmp_path):
    lines = TRAIN.read_text().splitlines()
    for bad, expected in [(b"{not json", ":3: not valid JSON"), (b"\xff\xfe", ":3: not valid JSON"), (b"", ":3: not valid JSON"),
                          (lines[0].encode(), ":3: info.task_id: duplicate 'tensor_ops/reshape_blocks' (first at line 1)")]:
        path = tmp_path / "rows.jsonl"
        path.write_bytes(b"\n".join([lines[0].encode(), lines[1].encode(), bad, lines[2].encode()]) + b"\n")
        with pytest.raises(RowError, match=re.escape(f"{path}{expected}")):
            load_rows(path)


def test_loaded_rows_are_typed_records_with_plain_tensors():
    rows = load_rows(TRAIN)
    assert [row.task_id for row in rows] == [task.id for task in TASKS]
    for row in rows:
        assert row.category == row.task_id.split("/")[0]
        assert all(type(t) is torch.Tensor for t in [*row.inputs.values(), row.expected])
