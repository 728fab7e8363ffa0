"""Why a rollout failed, told from what its run recorded.

The verdict's outcome (ptenv.grader.Outcome; runs saved before 0.5.0 call it `kind`) names the
failure. Every run records the verdict: v1 in each trace's info, classic in each row's info (and at
the row's top level with `vf-eval -C scoring_error,verdict`). Runs saved before verdicts had an
outcome are told by their reason's wording, and runs saved with no verdict at all by the 0-weight metrics, which tell all
reasons apart but one: a result with neither the right shape nor the right dtype may also be an
invalid answer (not a plain tensor); such rollouts count as invalid answers and are reported as
guessed.
"""

REASONS = ("no result", "shape", "dtype", "values", "invalid answer", "error", "timeout", "harness error")
REASON_OF_OUTCOME = {"pass": "pass", "no_result": "no result", "shape": "shape", "dtype": "dtype", "values": "values",
                  "invalid_result": "invalid answer", "error": "error", "timeout": "timeout",
                  "not_graded": "harness error"}
DIAGNOSTICS = ("result_present", "shape_match", "dtype_match")


def classify(record: dict) -> tuple[str, bool]:
    """("pass" or one of REASONS, whether it was guessed); ValueError if the record cannot tell."""
    metrics = record["metrics"]
    if record["scoring_error"] or metrics.get("harness_error") == 1.0 or record.get("failed"):
        return "harness error", False
    if record["reward"] == 1.0:
        return "pass", False
    verdict = record["verdict"]
    outcome = verdict.get("outcome", verdict.get("kind")) if isinstance(verdict, dict) else None
    if outcome is not None:
        if outcome not in REASON_OF_OUTCOME:
            raise ValueError(f"its verdict's outcome {outcome!r} is not one of {sorted(REASON_OF_OUTCOME)}")
        return REASON_OF_OUTCOME[outcome], False
    if isinstance(verdict, dict) and isinstance(verdict.get("reason"), str):  # saved before verdicts had an outcome
        return from_reason(verdict["reason"]), False
    if any(metrics.get(key) not in (0.0, 1.0) for key in DIAGNOSTICS):
        raise ValueError(f"neither a verdict nor the {', '.join(DIAGNOSTICS)} metrics are recorded")
    present, shape, dtype = (metrics[key] == 1.0 for key in DIAGNOSTICS)
    if not present:
        return "no result", False
    if shape and dtype:
        return "values", False
    if shape != dtype:
        return ("dtype" if shape else "shape"), False
    return "invalid answer", True


def from_reason(reason: str) -> str:
    """The failure the reason of a verdict saved before verdicts had an outcome names (the grader's
    wording then: shape before dtype, "values:" first, "no result", "not graded")."""
    if reason == "no result":
        return "no result"
    if reason == "not graded":
        return "harness error"
    for prefix, failure in (("shape ", "shape"), ("dtype ", "dtype"), ("values:", "values")):
        if reason.startswith(prefix):
            return failure
    return "invalid answer"
