"""Whose failure it is: the question every failure while assessing a rollout must answer.

A ModelFault is the model's doing: its answer, or anything its processes sent or failed to send.
The rollout scores 0.0, and the verdict says why. A HarnessFault is ours: a sandbox that did not
answer as the protocol says, a supervisor that failed, a task that could not draw its cases. The
rollout scores 0.0 and carries a scoring_error, which trainers mask. Each is raised where the fact
is known and turned into an Assessment in one place (assess.assessment_of).
"""


class ModelFault(Exception):
    """The model's: a verdict with this outcome and reason (ptenv.grader.Outcome)."""

    def __init__(self, outcome: str, reason: str, *, result_present: bool = True):
        super().__init__(reason)
        self.outcome, self.reason, self.result_present = outcome, reason, result_present


class HarnessFault(Exception):
    """Ours: `where` is the step that failed ("reading result back"), `reason` what happened."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where} failed: {reason}")
        self.where, self.reason = where, reason
