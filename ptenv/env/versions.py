"""The versions a run was made under, stamped into every rollout's `info` so a report can say
which package, torch and verifiers produced its numbers, and which tasks the default sets hold
(`splits`: the split version, the short sha256 of the committed manifest, ptenv/tasks/splits.py)."""

from importlib import metadata

import torch

from ptenv.tasks.splits import split_version


def versions() -> dict[str, str]:
    return {
        "pytorch-env": metadata.version("pytorch-env"),
        "torch": torch.__version__,
        "verifiers": metadata.version("verifiers"),
        "splits": split_version(),
    }
