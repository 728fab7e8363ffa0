"""A Response stop that never fires. tests/test_v1_env.py plugs it over pytorch-env's
`unsendable_tool_arguments` (`--env.taskset.task.stops`) to watch verifiers 0.4 fail without it.
Loaded by file path in the vf-eval process, so it imports nothing of the tests."""

import verifiers.v1 as vf


async def never(response: vf.Response) -> bool:
    return False
