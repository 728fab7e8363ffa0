"""The efficiency level (level 3, issue 38) in a real sandbox: the answer traced where no hidden value
is, its graphs run by the executor, the score weighed by cost against the expert implementation's
budget. The expert's answer scores 1.0 at its budget, a wasteful correct one less, and an answer that
reads values, or that is wrong, 0.0 as the model's failure, never a scoring error."""

import pytest

from ptenv.host import answer, requests
from ptenv.host.assess import assess_function
from ptenv.tasks import efficiency
from ptenv.tasks.fn_intermediate import TRIMMED_MEAN
from ptenv.tasks.functions import HiddenCases

CASES = HiddenCases("efficiency-test-secret", 6).of(TRIMMED_MEAN, 2)
LEVEL = efficiency.LEVEL

WASTEFUL = """
def trimmed_mean(x, k):
    ordered = x.sort(dim=0).values.clone()  # a copy the answer does not need: 1.6 times the budget
    return ordered[k:x.shape[0] - k].mean(dim=0)
"""
READS_VALUES = """
def trimmed_mean(x, k):
    columns = x.t().tolist()
    return torch.tensor([sum(sorted(c)[k:len(c) - k]) / (len(c) - 2 * k) for c in columns], dtype=x.dtype)
"""
EXAMPLE_CONSTANT = """
ANSWER = x.sort(dim=0).values[1:x.shape[0] - 1].mean(dim=0)  # the example's, at load time
def trimmed_mean(x, k):
    return ANSWER
"""


async def assess(box, source: str, partial_credit: bool = False):
    instance = TRIMMED_MEAN.instance("intermediate", 2, LEVEL)
    found = answer.function_source(f"```python\n{source}```", TRIMMED_MEAN.name)
    return await assess_function(box.client.call, box.id, source=found, name=TRIMMED_MEAN.name,
                                 inputs=instance.inputs(), cases=CASES, allowlist=TRIMMED_MEAN.allowlist(LEVEL),
                                 limits=box.client.limits, partial_credit=partial_credit,
                                 budgets=efficiency.budgets(TRIMMED_MEAN, CASES))


@pytest.mark.slow
@pytest.mark.rootless
async def test_the_experts_answer_scores_one_at_its_budget_and_a_wasteful_one_less(box):
    expert = await assess(box, efficiency.expert(TRIMMED_MEAN))
    assert expert.scoring_error is None and expert.verdict.score == 1.0, expert
    assert expert.cost == {"cost": expert.cost["budget"], "budget": sum(efficiency.budgets(TRIMMED_MEAN, CASES)),
                           "efficiency": 1.0}
    wasteful = await assess(box, WASTEFUL)
    assert wasteful.scoring_error is None and wasteful.verdict.outcome == "pass", wasteful
    ratio = wasteful.cost["cost"] / wasteful.cost["budget"]
    assert 1 < ratio < efficiency.ZERO_AT
    assert wasteful.verdict.score == pytest.approx(efficiency.factor(wasteful.cost["cost"], wasteful.cost["budget"]))
    assert 0 < wasteful.verdict.score < 1 and "efficiency" in wasteful.verdict.reason


@pytest.mark.slow
@pytest.mark.rootless
async def test_reading_values_or_a_wrong_answer_is_the_models_zero(box):
    reads = await assess(box, READS_VALUES)
    assert reads.scoring_error is None and reads.verdict.score == 0.0
    assert "could not be traced without values" in reads.verdict.reason, reads.verdict.reason
    constant = await assess(box, EXAMPLE_CONSTANT, partial_credit=True)
    assert constant.scoring_error is None and constant.verdict.outcome in ("shape", "values"), constant.verdict
    assert constant.hidden_pass_fraction == 0.0
    wrong = await assess(box, TRIMMED_MEAN.wrong["slice_to_minus_k"])
    assert wrong.scoring_error is None and wrong.verdict.score == 0.0 and wrong.verdict.outcome != "pass"
    assert (await box.cell("print('alive')")).stdout == "alive\n"


SLOW_TRACE = """
import time
TRACED = []
def trimmed_mean(x, k):
    if not TRACED:  # the first trace outlasts a hidden call's limit, as a big graph's may on a loaded machine
        time.sleep(SLEEP)
    TRACED.append(x.shape)
    return x.sort(dim=0).values[k:x.shape[0] - k].mean(dim=0)
"""


@pytest.mark.slow
@pytest.mark.rootless
async def test_a_trace_has_its_own_longer_limit(box):
    sleep = requests.CALL_LIMIT + 2
    assert sleep < requests.TRACE_LIMIT
    slow = await assess(box, SLOW_TRACE.replace("SLEEP", repr(sleep)))
    assert slow.scoring_error is None and slow.verdict.outcome == "pass", slow.verdict


STRIDED = """
def trimmed_mean(x, k):
    ordered = x.sort(dim=0).values
    columns = ordered.t()  # not contiguous: the executor checks each laid element is the tensor's own
    kept = columns.as_strided((columns.shape[0], columns.shape[1] - 2 * k), columns.stride(),
                              columns.storage_offset() + k * columns.stride(1))
    return kept.mean(dim=1)
"""
BEYOND = """
def trimmed_mean(x, k):
    ordered = x.sort(dim=0).values
    corner = ordered[:1, :1]  # one element, laid over the whole buffer
    rows = corner.as_strided((ordered.shape[0] - 2 * k, ordered.shape[1]), ordered.stride(), k * ordered.shape[1])
    return rows.mean(dim=0)
"""


@pytest.mark.slow
@pytest.mark.rootless
async def test_as_strided_runs_over_its_own_elements_under_the_allowlist_and_no_further(box):
    """The executor's check of as_strided runs under the task's allowlist: over a transposed tensor's
    own elements the answer passes; laid past a one-element view it is the model's 0, naming it."""
    strided = await assess(box, STRIDED)
    assert strided.scoring_error is None and strided.verdict.outcome == "pass", strided.verdict
    beyond = await assess(box, BEYOND)
    assert beyond.scoring_error is None and beyond.verdict.score == 0.0
    assert "outside its tensor" in beyond.verdict.reason, beyond.verdict.reason
