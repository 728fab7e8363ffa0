"""pytorch-env: PyTorch tasks in an isolated sandbox, graded on the host, on either verifiers line."""

import verifiers

if hasattr(verifiers, "SandboxEnv"):  # the classic API (verifiers <= 0.3.1): vf-eval calls load_environment
    from ptenv.env.classic import PyTorchEnv, load_environment

    __all__ = ["PyTorchEnv", "load_environment"]
else:  # verifiers 0.4 (verifiers.v1): vf-eval takes the Taskset, harness and env defaults from __all__
    from ptenv.env.v1 import PyTorchHarness, PyTorchTaskset, PyTorchV1Env

    __all__ = ["PyTorchTaskset", "PyTorchHarness", "PyTorchV1Env"]
