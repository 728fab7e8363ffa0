"""Tasks to dataset rows, and dataset rows back to typed records (strictly).

A row is {"question": str, "info": {"task_id", "category", "inputs": [{"name", "tensor"}],
"expected_output", "reference_solution"}}, tensors encoded by ptenv.inside.codec; a generated row's info
also carries its provenance ("tier", "family", "seed"). The expected output is
computed by running the reference solution exactly as a model's cell runs: single-threaded, in a
`new_namespace(inputs)`, answer left in `result`.
"""

import hashlib
import json
import keyword
import re
from dataclasses import dataclass

import torch

from ptenv.inside import codec
from ptenv.inside.namespace import new_namespace
from ptenv.tasks.host_state import reference_run
from ptenv.tasks.canonical import CATEGORIES, Task

ROW_KEYS = {"question", "info"}
INFO_KEYS = {"task_id", "category", "inputs", "expected_output", "reference_solution"}
PROVENANCE_KEYS = {"tier", "family", "seed"}  # generated rows only: train.jsonl stays as it was
FUNCTION_KEYS = {"kind", "level", "function"}  # function rows only (ptenv/tasks/functions.py)
TASK_ID = re.compile(r"[a-z_]+/[a-z0-9_]+(@[0-9]+(~[0-9]+)?)?")
RESERVED_NAMES = {"torch", "result"}


class RowError(ValueError):
    """A malformed dataset row; the message is one line naming the row, the field and the problem."""


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    category: str
    question: str
    inputs: dict[str, torch.Tensor]
    expected: torch.Tensor
    reference_solution: str
    digest: str  # of the task as posed (row_digest), so that a rollout names the row it was graded against
    tier: str = "basic"
    family: str = ""  # the task id for a canonical task
    seed: int | None = None
    kind: str = "result"  # or "function": the answer is a function, graded on hidden inputs
    level: int | None = None  # a function task's level
    function: str = ""  # a function task's function name

    def provenance(self) -> dict:
        row = {"tier": self.tier, "family": self.family or self.task_id, "seed": self.seed}
        if self.kind == "function":
            row.update(kind=self.kind, level=self.level, function=self.function)
        return row


@reference_run()
def build_inputs(task: Task) -> dict[str, torch.Tensor]:
    """Evaluate the task's input expressions (catalogue source, so trusted) with only `torch` in scope."""
    inputs = {}
    for name, source in task.inputs.items():
        value = eval(source, {"torch": torch})
        if type(value) is not torch.Tensor:
            raise TypeError(f"input {name!r} = {source} is a {type(value).__name__}, not a torch.Tensor")
        inputs[name] = value
    return inputs


def run_reference(task: Task):
    """Run the reference solution on fresh inputs as a model's cell would, and return its `result`."""
    return run_solution(task.solution, build_inputs(task), task.id)


def run_solution(solution: str, inputs: dict[str, torch.Tensor], name: str,
                 default_dtype: torch.dtype = torch.float32):
    """Run `solution` on private copies of `inputs` as a model's cell would (single-threaded, float32
    by default unless told), and return its `result`; the host's thread count, default dtype and RNG
    states are left as they were."""
    with reference_run(default_dtype):
        namespace = new_namespace(inputs)
        exec(compile(solution, f"<{name}>", "exec"), namespace)
    if "result" not in namespace:
        raise NameError("the solution left no `result`")
    return namespace["result"]


def instruction(does: str, inputs: dict[str, torch.Tensor], expected: torch.Tensor) -> str:
    """The prompt: every preloaded tensor with its dtype and shape, the task, and the exact form of `result`."""
    listed = "\n".join(f"- `{name}`: {t.dtype}, shape {tuple(t.shape)}" for name, t in inputs.items())
    return (f"These tensors are already defined in your Python session (`torch` is imported):\n{listed}\n\n"
            f"Task: {does}\n\n"
            f"Leave the answer in a variable named `result`. It must be a torch.Tensor with dtype "
            f"{expected.dtype} and shape {tuple(expected.shape)}.")


def build_row(task: Task) -> dict:
    """A canonical task's row, exactly as committed in train.jsonl."""
    return make_row(task.id, task.does, build_inputs(task), task.solution)


@reference_run()
def make_row(task_id: str, does: str, inputs: dict[str, torch.Tensor], solution: str, **provenance) -> dict:
    expected = run_solution(solution, inputs, task_id)
    return {
        "question": instruction(does, inputs, expected),
        "info": {
            "task_id": task_id,
            "category": task_id.split("/")[0],
            "inputs": [{"name": name, "tensor": codec.encode(t)} for name, t in inputs.items()],
            "expected_output": codec.encode(expected),
            "reference_solution": solution,
            **provenance,
        },
    }


def make_function_row(task_id: str, question: str, inputs: dict[str, torch.Tensor], outputs, reference: str,
                      **provenance) -> dict:
    """A function task's row: its expected output is the reference's (first) output on the example."""
    example = outputs[0] if isinstance(outputs, tuple) else outputs
    return {
        "question": question,
        "info": {
            "task_id": task_id,
            "category": task_id.split("/")[0],
            "inputs": [{"name": name, "tensor": codec.encode(t)} for name, t in inputs.items()],
            "expected_output": codec.encode(example.detach()),
            "reference_solution": reference,
            **provenance,
        },
    }


def dumps_rows(rows: list[dict]) -> str:
    """JSONL with sorted keys and ASCII only, so two builds are byte-identical."""
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def write_rows(tasks: list[Task], path: str) -> None:
    text = dumps_rows([build_row(task) for task in tasks])
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(text)


def read_jsonl(path) -> list[tuple[str, int, object]]:
    """(where, line number, object) for every line of a JSONL file; RowError naming file:line on the
    first line that is not JSON. The one reader of dataset files: parsing them is the caller's."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    objects = []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        try:
            objects.append((where, number, json.loads(line)))
        except ValueError as e:  # bad JSON or bad UTF-8
            raise RowError(f"{where}: not valid JSON: {e}") from None
    return objects


def load_rows(path: str) -> list[TaskRow]:
    """Parse every line of a JSONL file strictly; raise RowError naming file:line on the first bad row."""
    rows, seen = [], {}
    for where, number, obj in read_jsonl(path):
        row = parse_row(obj, where)
        if row.task_id in seen:
            raise RowError(f"{where}: info.task_id: duplicate {row.task_id!r} (first at line {seen[row.task_id]})")
        seen[row.task_id] = number
        rows.append(row)
    return rows


def parse_row(row, where: str) -> TaskRow:
    """Validate one row (a dict) and decode its tensors; `where` names the row in error messages."""
    def fail(field: str, problem: str):
        raise RowError(f"{where}: {field}: {problem}")

    def text(obj, field: str) -> str:
        if not isinstance(obj, str) or not obj.strip():
            fail(field, f"expected a non-empty string, got {_short(obj)}")
        return obj

    def tensor(obj, field: str) -> torch.Tensor:
        try:
            return codec.decode(obj)
        except codec.CodecError as e:
            fail(field, str(e))

    _exact_keys(row, ROW_KEYS, "row", fail)
    question = text(row["question"], "question")
    info = row["info"]
    generated = isinstance(info, dict) and bool(PROVENANCE_KEYS & set(info))
    function = isinstance(info, dict) and bool(FUNCTION_KEYS & set(info))
    keys = INFO_KEYS | (PROVENANCE_KEYS if generated or function else set()) | (FUNCTION_KEYS if function else set())
    _exact_keys(info, keys, "info", fail)
    task_id = text(info["task_id"], "info.task_id")
    category = text(info["category"], "info.category")
    if not TASK_ID.fullmatch(task_id):
        fail("info.task_id", f"{task_id!r} is not of the form category/short_name")
    if category not in CATEGORIES:
        fail("info.category", f"unknown category {category!r}")
    if task_id.split("/")[0] != category:
        fail("info.task_id", f"{task_id!r} does not start with its category {category!r}")
    if not isinstance(info["inputs"], list) or not info["inputs"]:
        fail("info.inputs", f"expected a non-empty list, got {_short(info['inputs'])}")
    inputs = {}
    for i, item in enumerate(info["inputs"]):
        field = f"info.inputs[{i}]"
        _exact_keys(item, {"name", "tensor"}, field, fail)
        name = item["name"]
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in RESERVED_NAMES:
            fail(f"{field}.name", f"{_short(name)} is not a usable variable name")
        if name in inputs:
            fail(f"{field}.name", f"duplicate input {name!r}")
        inputs[name] = tensor(item["tensor"], f"{field}.tensor")
    expected = tensor(info["expected_output"], "info.expected_output")
    if expected.is_complex() or (expected.numel() == 0 and not function) or not torch.isfinite(expected).all():
        fail("info.expected_output", f"a reference must be real, non-empty and finite, got {expected.dtype} "
                                     f"of shape {list(expected.shape)}")
    solution = text(info["reference_solution"], "info.reference_solution")
    try:
        compile(solution, task_id, "exec")
    except SyntaxError as e:
        fail("info.reference_solution", f"not valid Python: {e.msg} (line {e.lineno})")
    if not generated:
        return TaskRow(task_id, category, question, inputs, expected, solution, row_digest(row))
    seed = info["seed"]
    if not (isinstance(info["tier"], str) and isinstance(info["family"], str)
            and (seed is None or type(seed) is int)):
        fail("info", "tier and family must be strings and seed an integer or null")
    if not function:
        return TaskRow(task_id, category, question, inputs, expected, solution, row_digest(row), info["tier"],
                       info["family"], seed)
    name = info["function"]
    if info["kind"] != "function" or type(info["level"]) is not int or not isinstance(name, str) \
            or not name.isidentifier() or keyword.iskeyword(name):
        fail("info", "a function row needs kind 'function', an integer level and the function's name")
    return TaskRow(task_id, category, question, inputs, expected, solution, row_digest(row), info["tier"],
                   info["family"], seed, "function", info["level"], name)


def row_digest(row: dict) -> str:
    """The row without its expected output: the expected output is computed from the rest, and its
    float32 bits differ between CPU types (a matmul's accumulation order), so a digest that covered
    it would call a row changed when it was only rebuilt on another machine."""
    posed = {**row, "info": {k: v for k, v in row["info"].items() if k != "expected_output"}}
    return hashlib.sha256(json.dumps(posed, sort_keys=True).encode()).hexdigest()[:16]


def _exact_keys(obj, keys: set, field: str, fail) -> None:
    if not isinstance(obj, dict):
        fail(field, f"expected an object, got {_short(obj)}")
    if set(obj) != keys:
        missing, extra = sorted(keys - set(obj)), sorted(str(k) for k in set(obj) - keys)
        fail(field, f"keys differ: missing {missing}, unexpected {extra}")


def _short(obj) -> str:
    text = repr(obj)
    return text if len(text) <= 40 else f"{type(obj).__name__} {text[:37]}..."
