"""Grade an answer tensor against the reference: a binary score plus one-line diagnostics.

Host-side and pure. The answer is hostile: only an exact `torch.Tensor` gets past the first check,
so no subclass hook (`__eq__`, `__torch_function__`) ever runs, and nothing is executed from it.
Semantics: exact shape (no broadcasting), matching dtype family, ints and bools exact, floats
within |a - e| <= ATOL + RTOL * |e| in float64, where NaN and inf always fail.
"""

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from ptenv.inside.codec import DTYPE_NAMES

RTOL = 1e-5
ATOL = 1e-7


# How a verdict ends, one per way; the report counts these, and `reason` says more.
Outcome = Literal[
    "pass",
    "no_result",  # no `result` was set
    "invalid_result",  # not a plain dense CPU tensor the codec can carry (told here or by the sandbox)
    "shape",  # the shape is wrong (the dtype may be too)
    "dtype",  # the shape is right, the dtype family is not
    "values",  # shape and dtype family right; some values differ, beyond tolerance, NaN or infinite
    "not_graded",  # the harness failed before the answer could be read (ptenv.host.blame.HarnessFault)
    "error",  # a function task's function raised, could not be loaded, or its process died
    "timeout",  # a function task's function ran past its time limit on a hidden case
]
OUTCOMES: tuple[str, ...] = get_args(Outcome)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    score: float
    outcome: Outcome
    result_present: bool
    shape_match: bool
    dtype_match: bool
    values_match: bool
    reason: str  # one line for a person

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown verdict outcome {self.outcome!r}")

    @classmethod
    def passed(cls, reason: str = "match") -> "Verdict":
        return cls(score=1.0, outcome="pass", result_present=True, shape_match=True, dtype_match=True,
                   values_match=True, reason=reason)

    @classmethod
    def failed(cls, outcome: Outcome, reason: str, *, result_present: bool, shape_match: bool = False,
               dtype_match: bool = False, score: float = 0.0) -> "Verdict":
        """A verdict short of a pass; `score` is 0.0 but for partial credit."""
        return cls(score=score, outcome=outcome, result_present=result_present, shape_match=shape_match,
                   dtype_match=dtype_match, values_match=False, reason=reason)


def dtype_family(dtype: torch.dtype) -> str:
    """bool, integer, floating or complex; dtypes the codec cannot carry are 'unsupported'."""
    if dtype not in DTYPE_NAMES:
        return "unsupported"
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating" if dtype.is_floating_point else "integer"


def grade(answer, expected: torch.Tensor) -> Verdict:
    """Score `answer` (a decoded tensor, or None when there was no result) against `expected`.

    Never raises on a bad answer. A bad `expected` is a harness bug and raises ValueError.
    """
    if type(expected) is not torch.Tensor or expected.layout != torch.strided or expected.device.type != "cpu" \
            or dtype_family(expected.dtype) not in ("bool", "integer", "floating"):
        raise ValueError(f"expected must be a real-valued dense CPU torch.Tensor, got {_describe(expected)}")
    if answer is None:
        return Verdict.failed("no_result", "no result", result_present=False)
    if type(answer) is not torch.Tensor:
        return invalid_result(f"result is {_describe(answer)}, not a plain torch.Tensor")
    if answer.is_nested or answer.layout != torch.strided or answer.device.type != "cpu":
        return invalid_result(f"result must be a dense CPU tensor, got {_describe(answer)}")
    if not _storage_covers(answer):  # reading such a tensor crashes torch (no bounds check)
        return invalid_result("result's storage is smaller than its shape and strides need")
    shape_ok = answer.shape == expected.shape
    dtype_ok = dtype_family(answer.dtype) == dtype_family(expected.dtype)
    problems = []
    if not shape_ok:
        problems.append(f"shape {tuple(answer.shape)} != expected {tuple(expected.shape)}")
    if not dtype_ok:
        problems.append(f"dtype {answer.dtype} ({dtype_family(answer.dtype)}) is not in the expected "
                        f"{dtype_family(expected.dtype)} family")
    if problems:
        return Verdict.failed("dtype" if shape_ok else "shape", "; ".join(problems), result_present=True,
                              shape_match=shape_ok, dtype_match=dtype_ok)
    problem = _value_mismatch(answer.detach(), expected)
    if problem:
        return Verdict.failed("values", problem, result_present=True, shape_match=True, dtype_match=True)
    return Verdict.passed()


def _value_mismatch(answer: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when the values match, else one line saying how many differ and where (never the expected values)."""
    total = expected.numel()
    if dtype_family(expected.dtype) != "floating":
        bad = answer.to(torch.int64) != expected.to(torch.int64)
        if not bad.any():
            return None
        if expected.dtype == torch.bool:
            return f"values: {int(bad.sum())} of {total} elements differ: first at index {_first(bad)} (none allowed)"
        diff = (answer.to(torch.float64) - expected.to(torch.float64)).abs()
        return _beyond("differ", bad, diff, total, "up to 0 allowed")
    a, e = answer.to(torch.float64), expected.to(torch.float64)
    diff = (a - e).abs()
    # NaN compares False and inf leaves an inf (or NaN) difference, so both fail this test too.
    bad = ~(diff <= ATOL + RTOL * e.abs())
    if not bad.any():
        return None
    for kind, where in (("NaN", a.isnan()), ("infinite", a.isinf())):
        if where.any():
            return f"values: {int(where.sum())} of {total} elements are {kind} (first at index {_first(where)})"
    return _beyond("beyond tolerance", bad, diff, total, f"up to {ATOL:g} + {RTOL:g} * |expected| allowed")


def _storage_covers(t: torch.Tensor) -> bool:
    if t.numel() == 0:
        return True
    last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.untyped_storage().nbytes() >= (last + 1) * t.element_size()


def _beyond(verb: str, bad: torch.Tensor, diff: torch.Tensor, total: int, allowed: str) -> str:
    """Where the worst element is and the tolerance it broke, in torch.testing's words."""
    worst = int(torch.where(bad, diff, -1.0).reshape(-1).argmax())
    return (f"values: {int(bad.sum())} of {total} elements {verb}: greatest absolute difference "
            f"{diff.reshape(-1)[worst].item():.3g} at index {_index(worst, bad.shape)} ({allowed})")


def _first(mask: torch.Tensor) -> tuple:
    return _index(int(mask.reshape(-1).int().argmax()), mask.shape)


def _index(flat: int, shape: torch.Size) -> tuple:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _describe(obj) -> str:
    if type(obj) is torch.Tensor:
        return f"a {obj.layout} {obj.dtype} tensor on {obj.device.type}"
    return f"a {type(obj).__name__}"


def invalid_result(reason: str) -> Verdict:
    """A `result` that is there but is not an answer that can be compared."""
    return Verdict.failed("invalid_result", reason, result_present=True)


def grade_outputs(answer: list, expected: list[torch.Tensor]) -> Verdict:
    """The function's outputs (a tensor, or a tuple of them) against the reference's. Unlike a
    `result`, each must have the reference's exact dtype: the contract states it."""
    if len(answer) != len(expected):
        return Verdict.failed("shape", f"returned {len(answer)} tensor(s), the contract asks for {len(expected)}",
                              result_present=True)
    for i, (a, e) in enumerate(zip(answer, expected)):
        verdict = grade(a, e)
        where = f"output {i}: " if len(expected) > 1 else ""
        if verdict.score == 1.0 and a.dtype != e.dtype:
            verdict = Verdict.failed("dtype", f"dtype {a.dtype} != expected {e.dtype}", result_present=True,
                                     shape_match=True)
        if verdict.score != 1.0:
            return Verdict.failed(verdict.outcome, where + verdict.reason, result_present=True,
                                  shape_match=verdict.shape_match, dtype_match=verdict.dtype_match)
    return Verdict.passed()
