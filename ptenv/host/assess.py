"""Assessing a finished rollout on the host: a result task's `result` against its expected output,
or a function task's answer on its hidden cases. This is the one place where a fault (blame.py)
becomes an outcome: a ModelFault a 0.0 verdict with its reason, a HarnessFault a 0.0 verdict with
a scoring_error, and any other exception, a bug of ours, a HarnessFault too.
"""

from dataclasses import asdict, dataclass, replace

import torch

from ptenv.grader import Verdict, grade, grade_outputs
from ptenv.host import answer, requests
from ptenv.host.blame import HarnessFault, ModelFault
from ptenv.host.requests import CaseResult
from ptenv.inside import graph
from ptenv.inside.protocol import Limits, one_line
from ptenv.tasks import efficiency

FAILED_CALLS = {"error": "error", "died": "error", "timeout": "timeout", "invalid": "invalid_result"}  # -> outcome


@dataclass(frozen=True)
class Assessment:
    verdict: Verdict
    scoring_error: str | None = None
    hidden_pass_fraction: float | None = None  # function tasks: the fraction of hidden cases passed
    cost: dict | None = None  # the efficiency level: {"cost", "budget", "efficiency"} over the cases that ran

    def as_state(self) -> dict:
        state = {"verdict": asdict(self.verdict), "scoring_error": self.scoring_error}
        if self.hidden_pass_fraction is not None:
            state["hidden_pass_fraction"] = self.hidden_pass_fraction
        if self.cost is not None:
            state["cost"] = self.cost
        return state


def assessment_of(fault: Exception, hidden_pass_fraction: float | None = None) -> Assessment:
    """The one rule of blame: a ModelFault is the model's 0.0; anything else is the harness's."""
    if isinstance(fault, ModelFault):
        verdict = Verdict.failed(fault.outcome, fault.reason, result_present=fault.result_present)
        return Assessment(verdict, None, hidden_pass_fraction)
    reason = str(fault) if isinstance(fault, HarnessFault) else f"grading failed: {type(fault).__name__}: {one_line(fault)}"
    return Assessment(Verdict.failed("not_graded", "not graded", result_present=False), one_line(reason))


async def assess_result(call, sandbox_id: str, *, expected: torch.Tensor, timeout: float) -> Assessment:
    """Read `result` back and grade it. Never raises."""
    try:
        return Assessment(grade(await requests.read_result(call, sandbox_id, timeout=timeout), expected))
    except Exception as fault:
        return assessment_of(fault)


async def assess_function(call, sandbox_id: str, *, source: str | None, name: str, inputs: dict[str, torch.Tensor],
                          cases: list, allowlist: dict | None, limits: Limits, partial_credit: bool,
                          budgets: list[int] | None = None) -> Assessment:
    """Run the answer's function (its source, None if there is none: answer.function_source) on the
    hidden cases [(class, arguments, reference outputs)] in the sandbox, under the allowlist if any,
    and grade each case. `inputs` are the example inputs, defined where the answer loads. With
    `budgets` (the efficiency level, one per case) the function is traced and its graphs run
    instead (`efficiency_trial`), and the score is weighed by efficiency.factor. Never raises."""
    try:
        check_source(source, name)
        arguments = [args for _, args, _ in cases]
        if budgets is None:
            results, protected = await requests.trial(call, sandbox_id, source=source, name=name, inputs=inputs,
                                                      cases=arguments, allowlist=allowlist, limits=limits)
        else:
            results, costs, protected = await efficiency_trial(call, sandbox_id, source=source, name=name, inputs=inputs,
                                                               cases=arguments, allowlist=allowlist, limits=limits)
        verdict, fraction = trial_verdict(results, [c for c, _, _ in cases], [e for _, _, e in cases],
                                          partial_credit=partial_credit)
    except Exception as fault:
        return assessment_of(fault, hidden_pass_fraction=0.0)
    cost = None
    if budgets is not None:
        verdict, cost = weighed(verdict, costs, budgets)
    if not protected:
        verdict = replace(verdict, reason=verdict.reason + " (ran with less protection: the OS did not refuse all the trial refuses)")
    return Assessment(verdict, None, fraction, cost)


async def efficiency_trial(call, sandbox_id: str, *, source: str, name: str, inputs: dict[str, torch.Tensor],
                           cases: list[dict], allowlist: dict, limits: Limits) -> tuple[list[CaseResult], list, bool]:
    """The efficiency level's two trials in one sandbox: the answer traced on each case's dtypes and
    shapes (its callers never hold a hidden value), then, once they are gone, each graph run on its
    case by graph.EXECUTOR, which holds none of the answer's code. (one CaseResult per case, the
    cost of each case whose graph ran or None, whether both trials ran protected.)"""
    traced, protected = await requests.trial(call, sandbox_id, source=source, name=name, inputs=inputs, cases=cases,
                                             allowlist=allowlist, limits=limits, trace=True)
    graphs = [graph_text(result) for result in traced]
    runnable = [i for i, text in enumerate(graphs) if text is not None]
    ran, run_protected = await requests.trial(
        call, sandbox_id, source=graph.EXECUTOR, name="run_graph", inputs={}, allowlist=allowlist, limits=limits,
        cases=[{"graph": graphs[i], "allowed": allowlist["allow"],
                **{k: v for k, v in cases[i].items() if isinstance(v, torch.Tensor)}} for i in runnable]) \
        if runnable else ([], True)
    results, costs = list(traced), [None] * len(cases)
    for i, result in zip(runnable, ran):
        cost = result.outputs[-1] if result.outputs else None
        if result.outputs is None:
            results[i] = result
        elif cost.dtype != torch.int64 or cost.dim() != 0:  # a graph that broke its runner's process
            results[i] = CaseResult(None, "invalid", "the graph's run did not report its cost")
        else:
            results[i] = CaseResult(result.outputs[:-1], "ok", "")
            costs[i] = int(cost)
    for i, text in enumerate(graphs):
        if text is None and traced[i].outputs is not None:  # the answer's process sent something else
            results[i] = CaseResult(None, "invalid", "the traced graph did not arrive as JSON bytes")
    return results, costs, protected and run_protected


def graph_text(result: CaseResult) -> str | None:
    """A traced case's graph as JSON text, or None if its output is not one."""
    if result.outputs is None or len(result.outputs) != 1:
        return None
    data = result.outputs[0]
    if data.dtype != torch.uint8 or data.dim() != 1:
        return None
    try:
        return data.numpy().tobytes().decode()
    except UnicodeDecodeError:
        return None


def weighed(verdict: Verdict, costs: list, budgets: list[int]) -> tuple[Verdict, dict]:
    """The verdict with its score times the efficiency of the cases that ran (all their cost against
    all their budget), and the figures the rollout records."""
    ran = [(c, b) for c, b in zip(costs, budgets) if c is not None]
    cost, budget = sum(c for c, _ in ran), sum(b for _, b in ran)
    factor = efficiency.factor(cost, budget) if ran else 0.0
    figures = {"cost": cost, "budget": budget, "efficiency": factor}
    text = f"; cost {cost} against a budget of {budget}: efficiency {factor:.2f}" if ran else ""
    return replace(verdict, score=verdict.score * factor, reason=verdict.reason + text), figures


def check_source(source: str | None, name: str) -> None:
    """A ModelFault if there is no answer to run."""
    if source is None:
        raise ModelFault("no_result", f"no ```python block defining `{name}` in the final message", result_present=False)
    if len(source) > answer.MAX_ANSWER_CHARS:
        raise ModelFault("invalid_result",
                         f"the answer's code block has {len(source)} characters; at most {answer.MAX_ANSWER_CHARS} are run")


def trial_verdict(results: list[CaseResult], classes: list[str], expected: list[list[torch.Tensor]], *,
                  partial_credit: bool) -> tuple[Verdict, float]:
    """(the verdict, the fraction of cases passed): the verdict's score is 1.0 only when every case
    passes (or the fraction, with partial credit); its outcome and reason are the first failing case's."""
    first, passed = None, 0
    for i, (result, name, outputs) in enumerate(zip(results, classes, expected)):
        if result.outputs is None:
            case = Verdict.failed(FAILED_CALLS[result.status], result.reason, result_present=False)
        else:
            case = grade_outputs(result.outputs, outputs)
        passed += case.score == 1.0
        if case.score != 1.0 and first is None:
            first = (i, name, case)
    fraction = passed / len(results)
    if first is None:
        return Verdict.passed(f"all {len(results)} hidden cases pass"), 1.0
    i, name, case = first
    reason = f"hidden case {i + 1} of {len(results)} ({name}) failed: {case.reason}; {passed} of {len(results)} pass"
    return Verdict.failed(case.outcome, reason, result_present=case.result_present, shape_match=case.shape_match,
                          dtype_match=case.dtype_match, score=fraction if partial_credit else 0.0), fraction


def harness_fault(reason: str) -> Assessment:
    """A rollout that failed before it could be assessed (setup, a tool or the model's endpoint)."""
    return assessment_of(HarnessFault("the rollout", reason))
