"""Build the dataset from the task catalogue, or verify every task.

    python build_tasks.py --out train.jsonl   # write the rows (byte-identical across runs)
    python build_tasks.py --verify            # one line per task with each check, then a summary

A task passes when its reference runs cleanly and returns a real-valued tensor that is
deterministic, finite, non-empty, different from every input and exactly round-trips through the
codec, and when the real grader scores 0 for every degenerate answer (zeros, ones, the mean as a
constant, each input passed through, the float16-rounded reference) unless the entry justifies it.
"""

import argparse
import json
import sys
import time
from typing import NamedTuple

import torch

from ptenv import codec
from ptenv.dataset import build_inputs, run_reference, write_rows
from ptenv.grader import dtype_family, grade
from ptenv.tasks import TASKS, Task


class Check(NamedTuple):
    name: str
    ok: bool
    detail: str = ""  # the problem when failed; for the degenerate gate, the answers tried when passed


def _check(name: str, ok: bool, problem: str) -> Check:
    return Check(name, ok, "" if ok else problem)


def degenerate_answers(expected: torch.Tensor, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Answers a task must not accept: constants, inputs passed through, and a lower-precision reference."""
    mean = expected.to(torch.float64).mean()
    answers = {
        "zeros": torch.zeros_like(expected),
        "ones": torch.ones_like(expected),
        "mean": mean.expand(expected.shape).to(expected.dtype),
    }
    for name, tensor in inputs.items():
        if tensor.shape == expected.shape and dtype_family(tensor.dtype) == dtype_family(expected.dtype):
            answers[f"input:{name}"] = tensor
    if expected.is_floating_point():
        answers["float16"] = expected.to(torch.float16).to(expected.dtype)
    return answers


def check_task(task: Task) -> list[Check]:
    """Run every check on one task; later checks are skipped once the reference itself is unusable."""
    try:
        inputs = build_inputs(task)
        result, again = run_reference(task), run_reference(task)
    except Exception as e:
        return [Check("runs", False, _one_line(e))]
    checks = [Check("runs", True)]
    try:
        encoded = codec.encode(result)
    except codec.CodecError as e:
        return checks + [Check("tensor", False, _one_line(e))]
    if result.is_complex():
        return checks + [Check("tensor", False, f"complex dtype {result.dtype}")]
    checks.append(Check("tensor", True))
    checks.append(_check("deterministic", _encodes_equal(again, encoded), "second run differs"))
    checks.append(_check("finite", bool(torch.isfinite(result).all()), "NaN or inf in the answer"))
    checks.append(_check("non_empty", result.numel() > 0, "answer has no elements"))
    same = [name for name, t in inputs.items()
            if t.shape == result.shape and torch.equal(t.to(torch.float64), result.detach().to(torch.float64))]
    checks.append(_check("non_identity", not same, f"answer equals input {', '.join(same)}"))
    expected = codec.decode(json.loads(json.dumps(encoded)))
    exact = expected.dtype == result.dtype and expected.shape == result.shape and codec.encode(expected) == encoded
    checks.append(_check("round_trip", exact and grade(expected, expected).score == 1.0, "decoded answer differs"))
    if expected.numel():
        checks.append(_degenerate_check(task, expected, inputs))
    return checks


def _degenerate_check(task: Task, expected: torch.Tensor, inputs: dict[str, torch.Tensor]) -> Check:
    answers = degenerate_answers(expected, inputs)
    passing = {name for name, answer in answers.items() if grade(answer, expected).score != 0.0}
    let_through = sorted(passing - set(task.degenerate_ok))
    stale = sorted(set(task.degenerate_ok) - passing)
    if let_through:
        return Check("degenerate", False, f"grader accepts {', '.join(let_through)}")
    if stale:
        return Check("degenerate", False, f"degenerate_ok lists {', '.join(stale)} but the grader rejects it")
    return Check("degenerate", True, ",".join(answers))


def _encodes_equal(tensor, encoded: dict) -> bool:
    try:
        return codec.encode(tensor) == encoded
    except codec.CodecError:
        return False


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def verify(tasks: list[Task]) -> bool:
    start = time.perf_counter()
    failed = 0
    width = max(len(task.id) for task in tasks)
    for task in tasks:
        checks = check_task(task)
        ok = all(c.ok for c in checks)
        failed += not ok
        parts = [f"{c.name}:{'ok' if c.ok else 'FAIL'}" + (f"({c.detail})" if c.detail else "") for c in checks]
        print(f"{'ok  ' if ok else 'FAIL'} {task.id:<{width}}  {' '.join(parts)}", flush=True)
    print(f"{len(tasks)} tasks: {len(tasks) - failed} passed, {failed} failed ({time.perf_counter() - start:.1f} s)")
    return failed == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", metavar="PATH", help="write the dataset as JSONL")
    mode.add_argument("--verify", action="store_true", help="check every task and exit non-zero on any failure")
    args = parser.parse_args(argv)
    if args.verify:
        return 0 if verify(TASKS) else 1
    write_rows(TASKS, args.out)
    print(f"wrote {len(TASKS)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
