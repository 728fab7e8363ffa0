"""Task families: a family and an integer seed give one task instance, the same bytes on every run.

A family samples its parameters and inputs from a torch.Generator seeded by a SHA-256 of
(family id, seed), never Python's salted `hash()`, and fills its instruction and reference
solution from the parameters (string.Template, `$name`). Every basic family is a canonical task
of ptenv/tasks.py: its canonical member is that task as committed, and a seed redraws its input
values (same shapes, dtypes and parameters, so the instruction is unchanged). The intermediate
and advanced families (ptenv/tasks_intermediate.py, ptenv/tasks_advanced.py) sample shapes,
values and parameters, and state the maths rather than the function to call.
"""

import hashlib
from dataclasses import dataclass, field
from string import Template
from typing import Callable

import torch

from ptenv.dataset import build_inputs, make_row
from ptenv.tasks import Task


@dataclass(frozen=True)
class Instance:
    """One task, canonical or generated: what the dataset row and the --verify gates are built from."""
    id: str
    tier: str
    family: str
    seed: int | None  # None for a canonical task
    does: str
    inputs: dict[str, torch.Tensor]
    solution: str
    independent: str | None = None  # another formulation of the answer, for the tolerance gate
    degenerate_ok: dict[str, str] = field(default_factory=dict)
    float64_off: str = ""  # why the float64 recompute may fail (ptenv/tasks.py says which task and why)

    @property
    def category(self) -> str:
        return self.id.split("/")[0]

    def row(self) -> dict:
        """The dataset row: a canonical task's exactly as in train.jsonl, a generated one with provenance."""
        if self.seed is None:
            return make_row(self.id, self.does, self.inputs, self.solution)
        return make_row(self.id, self.does, self.inputs, self.solution, tier=self.tier, family=self.family, seed=self.seed)


@dataclass(frozen=True)
class Family:
    """A generated family: `sample(g)` returns (params, inputs); `does`, `solution` and
    `independent` are templates over the params. A held-out family appears only in the test split."""
    id: str
    does: str
    sample: Callable[[torch.Generator], tuple[dict, dict[str, torch.Tensor]]]
    solution: str
    independent: str | None = None
    held_out: bool = False

    def instance(self, tier: str, seed: int) -> Instance:
        params, inputs = self.sample(generator(self.id, seed))
        fill = lambda text: Template(text).substitute(params) if text is not None else None  # noqa: E731
        return Instance(f"{self.id}@{seed}", tier, self.id, seed, fill(self.does), inputs,
                        fill(self.solution), fill(self.independent))


def generator(family_id: str, seed: int) -> torch.Generator:
    digest = hashlib.sha256(f"{family_id}#{seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


# --- sampling helpers ----------------------------------------------------------------------------


def randint(g: torch.Generator, low: int, high: int) -> int:
    """An integer in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=g))


def pick(g: torch.Generator, options):
    return options[randint(g, 0, len(options) - 1)]


def normal(g: torch.Generator, *shape, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def uniform(g: torch.Generator, low: float, high: float, *shape, dtype=torch.float32) -> torch.Tensor:
    return (low + (high - low) * torch.rand(*shape, generator=g, dtype=torch.float64)).to(dtype)


# --- basic families: the canonical tasks with redrawn values -----------------------------------


def canonical_instance(task: Task) -> Instance:
    return Instance(task.id, "basic", task.id, None, task.does, build_inputs(task), task.solution,
                    degenerate_ok=task.degenerate_ok, float64_off=task.float64_off)


def basic_instance(task: Task, seed: int) -> Instance:
    g = generator(task.id, seed)
    inputs = {name: _redraw(g, t) for name, t in build_inputs(task).items()}
    return Instance(f"{task.id}@{seed}", "basic", task.id, seed, task.does, inputs, task.solution,
                    degenerate_ok=task.degenerate_ok, float64_off=task.float64_off)


def _redraw(g: torch.Generator, t: torch.Tensor) -> torch.Tensor:
    """Fresh values of the same shape and dtype within the canonical input's range: bools and 0/1
    values stay binary, integers (indices, targets) stay within the canonical ones' range."""
    if t.dtype == torch.bool:
        return torch.rand(t.shape, generator=g) < 0.5
    low, high = t.min().item(), t.max().item()
    if not t.is_floating_point():
        return torch.randint(int(low), int(high) + 1, t.shape, generator=g, dtype=t.dtype)
    if ((t == 0) | (t == 1)).all():
        return (torch.rand(t.shape, generator=g) < 0.5).to(t.dtype)
    return uniform(g, low, high, *t.shape, dtype=t.dtype)


@dataclass(frozen=True)
class BasicFamily:
    """A canonical task as a family: its seeded members redraw the canonical inputs' values."""
    task: Task
    held_out = False  # the canonical task is in train, so its family cannot be held out

    @property
    def id(self) -> str:
        return self.task.id

    def instance(self, tier: str, seed: int) -> Instance:
        return basic_instance(self.task, seed)
