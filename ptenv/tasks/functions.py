"""Function tasks: the model writes a named function to a stated contract, and the function is run
on hidden inputs after the rollout.

A FunctionFamily states the contract (what the function returns for any valid input, the ranks,
dtypes and sizes it must accept, the edge cases it rules on) and names its hidden-case classes:
each Case samples the keyword arguments of one call, and the contract states it (`phrase`). The
example shown to the model is a draw of the first class, preloaded by name as a result task's
inputs are.

Hidden cases are drawn on the host for each rollout alone, from seeds the model cannot know (a
secret of the evaluation and a nonce of the rollout, see `HiddenCases`), one of each class in
order, then again from the first; the references are computed on the host and never enter the
sandbox. A set of draws is
kept only when the references pass against their float64 recompute (the tolerance gate) and every
plausible wrong implementation the family lists fails at least one case, while every other correct
implementation it lists passes them all; otherwise it is redrawn.

Levels: 1 lists the hidden-case classes under the contract and gives the family's hint (the
torch functions that help, the op itself included); 2 gives the contract alone, which still states
every class, and runs the hidden calls under the family's allowlist (ptenv/tasks/allowed.py,
ptenv/inside/allowlist.py): only the stated operations run, none of which computes the contract
whole, and for a backward, automatic differentiation is removed too; 3 (ptenv/tasks/efficiency.py)
is level 2 graded as a graph traced without values, and its cost counts against a budget.
"""

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from ptenv.grader import grade_outputs
from ptenv.inside.protocol import MAX_HIDDEN_CASES
from ptenv.tasks import efficiency
from ptenv.tasks.allowed import BASE, Group
from ptenv.tasks.families import (MARGIN, SHORTCUT_MARGIN, float64_inputs, generator, rounding_sensitivity,
                                  seeded, seen_by_gate, tolerance_ratio)
from ptenv.tasks.host_state import reference_run
from ptenv.tasks.rows import make_function_row

LEVELS = (1, 2, 3)
DEFAULT_HIDDEN_CASES = 8
MAX_DRAWS = 20
Args = dict  # keyword arguments of one call: tensors, and ints, floats, bools, strings, None or lists of ints


def check_function_arguments(hidden_cases, partial_credit) -> None:
    if type(hidden_cases) is not int or not 1 <= hidden_cases <= MAX_HIDDEN_CASES:
        raise ValueError(f"hidden_cases must be an integer from 1 to {MAX_HIDDEN_CASES}, got {hidden_cases!r}")
    if type(partial_credit) is not bool:
        raise ValueError(f"partial_credit must be true or false, got {partial_credit!r}")


@dataclass(frozen=True)
class Case:
    name: str  # the class, as a verdict names it: "empty segment"
    phrase: str  # the words of the contract that state this class (a test finds them there)
    sample: Callable[[torch.Generator], Args]


@dataclass(frozen=True)
class FunctionFamily:
    id: str  # category/short_name, as a result family's
    name: str  # the function's name
    params: tuple[str, ...]  # its parameters, in order
    contract: str
    cases: tuple[Case, ...]  # the first class's draw is also the example
    reference: str  # source defining `name`; runs on the host only
    wrong: dict[str, str] = field(default_factory=dict)  # plausible wrong implementations, by name
    # Other correct implementations a solver would write (autograd over torch's op, the natural
    # float32 formula): each must pass every kept case, so the tolerance does not fail a fair answer.
    # Every family lists `literal`: the contract's words as code, written from the contract alone (issue
    # 35), so a draw where the words and the reference disagree is never kept.
    also_correct: dict[str, str] = field(default_factory=dict)
    hint: str = ""  # level 1 only: which torch functions help
    held_out: bool = False
    # The hardest level's allowlist: BASE and these groups (ptenv/tasks/allowed.py), less `banned`,
    # the aten ops (overload packets) among them that compute the contract whole
    # (tests/test_allowlist.py searches every op the allowlist leaves).
    allowed: tuple[Group, ...] = ()
    banned: tuple[str, ...] = ()
    own_gradient: bool = False  # a backward whose hardest level removes automatic differentiation
    # Issue 24: the set is gated in float64 alone, as a result family's (families.decided_in_float64).
    float64_margin: bool = False

    @property
    def by_hand(self) -> str:
        """An implementation that passes under the allowlist: the reference, or where the reference
        calls an op the allowlist leaves out, the `by_hand` one of also_correct."""
        return self.also_correct.get("by_hand", self.reference)

    @property
    def groups(self) -> tuple[Group, ...]:
        return BASE + self.allowed

    def allowlist(self, level: int) -> dict | None:
        """What the trial allows at this level, as the `trial` request carries it: None
        (everything), or the aten packets allowed and whether autograd is."""
        if level == 1:
            return None
        ops = {f"aten::{op}" for group in self.groups for op in group.ops if op not in self.banned}
        return {"allow": sorted(ops), "autograd": not self.own_gradient}

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.params)})"

    @property
    def levels(self) -> tuple[int, ...]:
        """This family's levels: the efficiency level only where its expert implementation traces."""
        return LEVELS if efficiency.has_level(self) else LEVELS[:-1]

    def instance(self, tier: str, seed: int, level: int = 1) -> "FunctionInstance":
        if level not in self.levels:
            raise ValueError(f"{self.id} has levels {self.levels}, not {level}: {efficiency.UNTRACED.get(self.id, '')}")
        args = self.cases[0].sample(generator(self.id, seed))
        return FunctionInstance(self, tier, seed, level, args)

    def draw(self, key: str, n: int, draw: int = 0) -> list[tuple[str, Args]]:
        """n hidden cases: the classes in order, then again from the first. Sampled single-threaded, as
        the gates run: starting a thread pool costs more than the work on such small tensors (a float64
        log_softmax in a sampler took 9 ms with two threads on a busy machine, 1 us with one)."""
        cases = []
        with reference_run():
            for k in range(n):
                case = self.cases[k % len(self.cases)]
                cases.append((case.name, case.sample(seeded(f"{self.id}#hidden#{key}#{k}#{draw}"))))
        return cases


@dataclass(frozen=True)
class FunctionInstance:
    family: FunctionFamily
    tier: str
    seed: int
    level: int
    example: Args

    @property
    def id(self) -> str:
        return f"{self.family.id}@{self.seed}" + (f"~{self.level}" if self.level != 1 else "")

    def inputs(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.example.items() if isinstance(v, torch.Tensor)}

    def row(self) -> dict:
        f = self.family
        return make_function_row(self.id, question(f, self.example, self.level), self.inputs(),
                                 call(f.reference, f.name, self.example), f.reference, tier=self.tier,
                                 family=f.id, seed=self.seed, kind="function", level=self.level,
                                 function=f.name)


def question(f: FunctionFamily, example: Args, level: int) -> str:
    tensors = "\n".join(f"- `{k}`: {v.dtype}, shape {tuple(v.shape)}" for k, v in example.items()
                        if isinstance(v, torch.Tensor))
    shown = ", ".join(f"{k}={k}" if isinstance(v, torch.Tensor) else f"{k}={v!r}" for k, v in example.items())
    parts = [f"Write a Python function `{f.signature}`.", "", f"Contract: {f.contract}"]
    if level == 1:
        parts += ["", "Your function is checked on hidden inputs of each of these kinds: "
                  + "; ".join(c.name for c in f.cases) + "."]
        if f.hint:
            parts += [f"Hint: {f.hint}"]
    if f.allowlist(level):
        parts += ["", allowlist_text(f)]
    if level == efficiency.LEVEL:
        parts += ["", efficiency.instruction(f, example)]
    called = "traced as above, and its graph run," if level == efficiency.LEVEL else "called"
    parts += ["", f"Example inputs are preloaded in your Python session (`torch` is imported):\n{tensors}",
              f"Example call: `{f.name}({shown})`.", "",
              f"Your answer is the last ```python code block in your final message that defines `{f.name}`. "
              f"It runs in a fresh Python process (with `torch` imported and the example inputs defined) "
              f"and `{f.name}` is {called} on hidden inputs that follow the contract; it must return what "
              f"the contract says, with the same dtypes and shapes as the reference would."]
    return "\n".join(parts)


def allowlist_text(f: FunctionFamily) -> str:
    """The hardest level's rule, as the instruction states it."""
    text = ("On the hidden inputs only these operations run: " + "; ".join(g.says for g in f.groups)
            + ". torch functions made of them run too (`torch.matmul`, `F.pad` with a constant, `Tensor.reshape`, "
            "...); every other operation raises an error that names it, and so do numpy and ctypes.")
    if f.banned:
        text += " Not here: " + ", ".join(f"`torch.ops.aten.{op}`" for op in f.banned) + "."
    if f.own_gradient:
        text += (" Automatic differentiation is removed too (`requires_grad`, `torch.autograd`, `Tensor.backward`, "
                 "`torch.func`, forward mode): derive the gradient yourself.")
    return text


@functools.lru_cache(maxsize=1024)
def compiled(source: str, name: str):
    """The code of a trusted implementation, compiled once: a draw's gates run each one on every case."""
    return compile(source, f"<{name}>", "exec")


def call(source: str, name: str, args: Args, default_dtype: torch.dtype = torch.float32):
    """Run a trusted implementation (the reference, or a listed wrong one) on private copies of
    `args`, as the sandbox runs it (one thread), leaving the host's torch as it was."""
    namespace = {"torch": torch, "__name__": "__main__"}
    exec(compiled(source, name), namespace)
    copies = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with reference_run(default_dtype):
        return namespace[name](**copies)


def as_outputs(value) -> list:
    """A function's return value as the list of its outputs (a tuple's items, or the one value)."""
    return list(value) if isinstance(value, tuple) else [value]


class HiddenCases:
    """Hidden cases drawn from a secret the model never sees, so it cannot draw them in the sandbox.
    Each rollout gets a set of its own (the same classes, fresh seeds), named by its nonce: one
    rollout's trial could leak its inputs to another rollout of the prompt (through the host's page
    cache, issue 35), and what leaks is then worth nothing to it."""

    def __init__(self, secret: str, n: int):
        self.secret, self.n = secret, n

    def of(self, family: FunctionFamily, seed: int, nonce: str = "") -> list[tuple[str, Args, list[torch.Tensor]]]:
        """[(class, arguments, reference outputs)] for a rollout (its nonce) of the task (family,
        seed); without a nonce, the one set of the secret a test or a benchmark reuses. A gated
        draw runs the reference and every listed implementation: up to a second or more."""
        key = f"{self.secret}#{seed}" + (f"#{nonce}" if nonce else "")
        tag = hashlib.sha256(key.encode()).hexdigest()[:16]
        return gated_draw(family, tag, self.n)

    @property
    def secret_id(self) -> str:
        """A name for the secret that tells nothing of it: rollouts with the same drew alike."""
        return hashlib.sha256(f"secret id#{self.secret}".encode()).hexdigest()[:12]


def gated_draw(family: FunctionFamily, key: str, n: int) -> list[tuple[str, Args, list[torch.Tensor]]]:
    """The first set of n hidden cases that the tolerance grades fairly and that fails every listed
    wrong implementation somewhere; ValueError after MAX_DRAWS."""
    problems = []
    for draw in range(MAX_DRAWS):
        cases = family.draw(key, n, draw)
        problems = set_problems(family, cases)
        if not problems[0]:
            return problems[1]
    raise ValueError(f"{family.id}: no gradable set of hidden cases in {MAX_DRAWS} draws (last: {problems[0]})")


def set_problems(family: FunctionFamily, cases) -> tuple[list[str], list]:
    """(problems, the cases with their reference outputs)."""
    if family.float64_margin:
        return float64_set_problems(family, cases)
    graded, gated, problems = [], [], []
    for name, args in cases:
        expected = as_outputs(call(family.reference, family.name, args))
        recomputed = as_outputs(call(family.reference, family.name, float64_inputs(args), torch.float64))
        seen = [seen_by_gate(e) for e in expected]  # the graded set keeps the reference's own outputs
        verdict = grade_outputs([seen_by_gate(r.to(e.dtype)) for r, e in zip(recomputed, expected)], seen)
        if verdict.score != 1.0:
            problems.append(f"{name}: float64 recompute: {verdict.reason}")
        graded.append((name, args, expected))
        gated.append(seen)
    for wrong, source in family.wrong.items():
        if all(passes(source, family.name, args, seen, gate=True) for (_, args, _), seen in zip(graded, gated)):
            problems.append(f"the wrong implementation {wrong!r} passes every case")
    for right, source in family.also_correct.items():
        failed = [name for (name, args, _), seen in zip(graded, gated)
                  if not passes(source, family.name, args, seen, gate=True)]
        if failed:
            problems.append(f"the correct implementation {right!r} fails {failed[0]}")
    return problems, graded


def float64_set_problems(family: FunctionFamily, cases) -> tuple[list[str], list]:
    """set_problems from float64 computations alone: the reference and each other correct
    implementation move by at most MARGIN of the tolerance under a float32 rounding of the inputs,
    and each wrong implementation misses some case by SHORTCUT_MARGIN tolerances."""
    graded, answers, problems = [], [], []
    for name, args in cases:
        answer = as_outputs(call(family.reference, family.name, float64_inputs(args), torch.float64))
        for way, source in {"float64 recompute": family.reference, **family.also_correct}.items():
            moved = rounding_sensitivity(lambda a: call(source, family.name, a, torch.float64), args,
                                         f"{family.id}#{name}", answer)
            if moved > MARGIN:
                problems.append(f"{name}: {way} moves by {moved:.3g} of the tolerance under a float32 rounding")
        graded.append((name, args, as_outputs(call(family.reference, family.name, args))))
        answers.append(answer)
    for wrong, source in family.wrong.items():
        if not any(misses(source, family.name, args, answer) for (_, args, _), answer in zip(graded, answers)):
            problems.append(f"the wrong implementation {wrong!r} passes every case")
    return problems, graded


def misses(source: str, name: str, args: Args, answer: list[torch.Tensor]) -> bool:
    """Whether `source` in float64 misses the float64 answer by SHORTCUT_MARGIN tolerances (or fails)."""
    try:
        outputs = as_outputs(call(source, name, float64_inputs(args), torch.float64))
    except Exception:
        return True
    return len(outputs) != len(answer) or max(tolerance_ratio(o, a) for o, a in zip(outputs, answer)) > SHORTCUT_MARGIN


def passes(source: str, name: str, args: Args, expected: list[torch.Tensor], gate: bool = False) -> bool:
    """Whether the implementation `source` passes the case; `gate`: as a draw's gate sees its outputs."""
    try:
        outputs = as_outputs(call(source, name, args))
        return grade_outputs([seen_by_gate(o) for o in outputs] if gate else outputs, expected).score == 1.0
    except Exception:
        return False
