"""The grader's semantics, property-tested: exact shape, dtype family, exact ints/bools, float tolerance,
NaN/inf always fail, only plain tensors count, and it never raises on a bad answer."""

import array
import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from ptenv.grader import ATOL, OUTCOMES, RTOL, Verdict, grade

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
SHAPES = st.lists(st.integers(1, 4), max_size=3)


@st.composite
def references(draw, dtypes=FLOATS + INTS + [torch.bool]):
    """A finite, non-empty reference tensor of any real dtype the tasks may use."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(SHAPES)
    n = math.prod(shape)
    if dtype == torch.bool:
        values = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif dtype.is_floating_point:
        values = draw(st.lists(st.floats(-1e4, 1e4, width=16), min_size=n, max_size=n))
    else:
        info = torch.iinfo(dtype)
        values = draw(st.lists(st.integers(max(info.min, -1000), min(info.max, 1000)), min_size=n, max_size=n))
    return torch.tensor(values, dtype=dtype).reshape(shape)


def flat_index(draw, t):
    return draw(st.integers(0, t.numel() - 1))


@settings(max_examples=150, deadline=None)
@given(references())
def test_reference_passes_itself_and_a_non_contiguous_copy(e):
    assert grade(e.clone(), e) == Verdict.passed("match")
    if e.dim() >= 2:
        assert grade(e.T.contiguous().T, e).score == 1.0


@settings(max_examples=150, deadline=None)
@given(references(FLOATS), st.data())
def test_float_tolerance_is_atol_plus_rtol_times_expected(e, data):
    i = flat_index(data.draw, e)
    answer = e.to(torch.float64, copy=True).reshape(-1)
    tol = ATOL + RTOL * abs(answer[i].item())
    sign = data.draw(st.sampled_from([-1.0, 1.0]))
    answer[i] += sign * 0.5 * tol
    assert grade(answer.reshape(e.shape), e).score == 1.0
    answer[i] += sign * 2 * tol
    verdict = grade(answer.reshape(e.shape), e)
    assert verdict.score == 0.0 and verdict.shape_match and verdict.dtype_match and not verdict.values_match
    assert verdict.outcome == "values" and verdict.reason.startswith("values: 1 of ")
    assert "beyond tolerance" in verdict.reason
    assert verdict.reason.endswith(f"(up to {ATOL:g} + {RTOL:g} * |expected| allowed)")


@settings(max_examples=100, deadline=None)
@given(references(INTS + [torch.bool]), st.data())
def test_one_changed_int_or_bool_element_fails(e, data):
    i = flat_index(data.draw, e)
    answer = e.clone().reshape(-1)
    answer[i] = ~answer[i] if e.dtype == torch.bool else answer[i] + (1 if answer[i] < 100 else -1)
    verdict = grade(answer.reshape(e.shape), e)
    assert verdict.score == 0.0 and verdict.outcome == "values" and verdict.reason.startswith("values: 1 of ")
    assert verdict.reason.endswith("(none allowed)" if e.dtype == torch.bool else "(up to 0 allowed)")


def test_integers_are_exact_where_allclose_is_not():
    assert torch.allclose(torch.tensor([100000]), torch.tensor([100001]))
    assert grade(torch.tensor([100001]), torch.tensor([100000])).score == 0.0


@settings(max_examples=100, deadline=None)
@given(references(), st.sampled_from(["lead1", "trail1", "squeeze", "first", "flatten"]))
def test_broadcast_compatible_wrong_shapes_fail(e, how):
    wrong = {"lead1": lambda: e.unsqueeze(0), "trail1": lambda: e.unsqueeze(-1),
             "squeeze": lambda: e.reshape(-1)[:1].reshape(()),
             "first": lambda: e.reshape(-1)[:1], "flatten": lambda: e.reshape(-1)}[how]()
    assume(wrong.shape != e.shape)
    verdict = grade(wrong, e)
    assert verdict.score == 0.0 and not verdict.shape_match and verdict.outcome == "shape"
    assert verdict.reason.startswith(f"shape {tuple(wrong.shape)} != expected {tuple(e.shape)}")


@settings(max_examples=100, deadline=None)
@given(references(INTS), st.sampled_from(FLOATS))
def test_int_reference_rejects_float_answer_with_equal_values(e, float_dtype):
    verdict = grade(e.to(float_dtype), e)
    assert verdict.score == 0.0 and verdict.shape_match and not verdict.dtype_match
    assert verdict.outcome == "dtype" and "integer family" in verdict.reason


@settings(max_examples=50, deadline=None)
@given(references([torch.bool]), st.sampled_from(INTS + FLOATS))
def test_bool_and_numbers_are_different_families(e, other):
    assert grade(e.to(other), e).score == 0.0
    assert grade(e, e.to(other)).score == 0.0


def test_other_integer_and_float_widths_are_accepted():
    e = torch.tensor([1, 2, 3])
    assert grade(e.to(torch.int32), e).score == 1.0
    assert grade(torch.tensor([0.1, 0.2]), torch.tensor([0.1, 0.2], dtype=torch.float64)).score == 1.0


@settings(max_examples=100, deadline=None)
@given(references(FLOATS), st.sampled_from([math.nan, math.inf, -math.inf]), st.data())
def test_nan_and_inf_answers_fail(e, bad, data):
    answer = e.clone().reshape(-1)
    answer[flat_index(data.draw, e)] = bad
    verdict = grade(answer.reshape(e.shape), e)
    assert verdict.score == 0.0 and verdict.outcome == "values"
    assert ("NaN" if math.isnan(bad) else "infinite") in verdict.reason


def test_inf_fails_even_against_an_inf_reference():
    assert grade(torch.tensor([math.inf]), torch.tensor([math.inf])).score == 0.0


class Liar(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True


@pytest.mark.parametrize("answer, kind, reason", [
    (None, "no_result", "no result"),
    ([1.0, 2.0], "invalid_result", "result is a list, not a plain torch.Tensor"),
    (array.array("f", [1.0, 2.0]), "invalid_result", "result is a array, not a plain torch.Tensor"),
    (1.5, "invalid_result", "result is a float, not a plain torch.Tensor"),
    (torch.nn.Parameter(torch.tensor([1.0, 2.0])), "invalid_result", "result is a Parameter, not a plain torch.Tensor"),
    (torch.zeros(2).as_subclass(Liar), "invalid_result", "result is a Liar, not a plain torch.Tensor"),
    (torch.tensor([1.0, 2.0], device="meta"), "invalid_result", "result must be a dense CPU tensor"),
    (torch.tensor([1.0, 2.0]).to_sparse(), "invalid_result", "result must be a dense CPU tensor"),
    (torch.tensor([1.0, 2.0], dtype=torch.complex64), "dtype", "not in the expected floating family"),
    (torch.tensor([1.0, 2.0]).to(torch.uint16), "dtype", "not in the expected floating family"),
])
def test_non_tensors_and_unusual_tensors_score_zero(answer, kind, reason):
    verdict = grade(answer, torch.tensor([1.0, 2.0]))
    assert verdict.score == 0.0 and verdict.outcome == kind and reason in verdict.reason
    assert verdict.result_present == (answer is not None)


def test_storage_shrunk_under_the_answer_scores_zero():
    answer = torch.tensor([1.0, 2.0])
    answer.untyped_storage().resize_(0)
    verdict = grade(answer, torch.tensor([1.0, 2.0]))
    assert verdict.score == 0.0 and verdict.outcome == "invalid_result" and "storage is smaller" in verdict.reason


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(JUNK, references(), references().map(lambda t: t.unsqueeze(0)),
                 references().map(lambda t: t.to(torch.complex64))), references())
def test_never_raises_and_reason_is_one_line(answer, expected):
    verdict = grade(answer, expected)
    assert verdict.score in (0.0, 1.0)
    assert verdict.reason and "\n" not in verdict.reason
    assert (verdict.outcome == "pass") == (verdict.score == 1.0) and verdict.outcome in OUTCOMES
    assert (verdict.score == 1.0) == (verdict.shape_match and verdict.dtype_match and verdict.values_match)


def test_reason_locates_the_worst_element_without_printing_expected_values():
    e = torch.linspace(0.123456, 9.87654, 12).reshape(3, 4)
    answer = e.clone()
    answer[1, 2] += 0.5
    answer[2, 3] += 0.25
    verdict = grade(answer, e)
    assert verdict.reason == ("values: 2 of 12 elements beyond tolerance: greatest absolute difference 0.5 at index "
                              "(1, 2) (up to 1e-07 + 1e-05 * |expected| allowed)")
    assert grade(torch.tensor([3, 9, 5]), torch.tensor([3, 4, 7])).reason == \
        "values: 2 of 3 elements differ: greatest absolute difference 5 at index (1,) (up to 0 allowed)"
    assert grade(torch.zeros(3), torch.zeros(3, 1)).reason == "shape (3,) != expected (3, 1)"


def test_a_wrong_shape_and_dtype_is_a_shape_verdict_and_a_verdict_outcome_must_be_known():
    verdict = grade(torch.zeros(3, dtype=torch.int64), torch.zeros(3, 1))
    assert (verdict.outcome, verdict.shape_match, verdict.dtype_match) == ("shape", False, False)
    assert "; dtype torch.int64" in verdict.reason
    with pytest.raises(ValueError, match="unknown verdict outcome"):
        Verdict.failed("wrong", "wrong", result_present=True)


def test_bad_expected_is_a_harness_error():
    with pytest.raises(ValueError, match="expected must be"):
        grade(torch.zeros(2), [0.0, 0.0])
