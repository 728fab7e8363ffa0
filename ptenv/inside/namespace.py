"""How a cell's namespace starts, shared by the reference runner on the host and the sandbox's interpreter."""

import builtins

import torch


def new_namespace(inputs: dict[str, torch.Tensor]) -> dict:
    """A fresh namespace: `torch` imported and each input preloaded under its name (a private copy)."""
    namespace = {"__name__": "__main__", "__builtins__": builtins, "torch": torch}
    namespace.update({name: tensor.clone() for name, tensor in inputs.items()})
    return namespace
