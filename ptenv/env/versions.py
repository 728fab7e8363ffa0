"""The versions a run was made under, stamped into every rollout's `info` so a report can say
which package, torch and verifiers produced its numbers."""

from importlib import metadata

import torch


def versions() -> dict[str, str]:
    return {
        "pytorch-env": metadata.version("pytorch-env"),
        "torch": torch.__version__,
        "verifiers": metadata.version("verifiers"),
    }
