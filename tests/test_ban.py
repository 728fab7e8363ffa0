"""The ban of a function family's hardest level (ptenv/inside/ban.py) is closed and fair.

Closed: with the family's ban installed, the op search (tests/support/op_search.py) finds no aten op
that computes its contract, or one mode of it, whole; the search and the ban run in a child process,
since the ban changes process-global state for good. Fair: an honest implementation (the reference,
or its `by_hand` reimplementation where the reference calls a banned op or autograd) passes every
hidden case in a real sandbox's caller under the ban, while the reference that calls a banned op fails
with a reason that names the ban."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from ptenv.host.assess import assess_function
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.tiers import FUNCTION_TIERS
from tests.support import op_search

FAMILIES = [family for members in FUNCTION_TIERS.values() for family in members]
BANNED = [f for f in FAMILIES if f.banned]
HELD = [f for f in FAMILIES if f.banned or f.own_gradient]
CASES = HiddenCases("test-ban", 8)
NAMES_THE_BAN = "is banned in this task's trial"
THREAT_MODEL = Path(__file__).parent.parent / "docs" / "threat-model.md"
# The families whose contract (or a mode of it) some torch op computes whole, and the backward
# passes that autograd computes: the search found these (tests/support/op_search.py). A new family
# with `banned` or `own_gradient` is added here (docs/function-tasks.md, "Adding a family").
BANNED_FAMILIES = {"embedding_bag_fn", "scatter_reduce_fn", "unfold_fn", "fold_fn", "adaptive_pool1d_fn",
                   "interpolate_linear_fn", "cumulative_fn", "searchsorted_fn", "nll_loss_fn", "cross_entropy_fn",
                   "ctc_loss_fn", "grid_sample_fn", "layer_norm_backward_fn", "batch_norm_backward_fn",
                   "conv_transpose1d_fn"}
OWN_GRADIENT_FAMILIES = {"layer_norm_backward_fn", "masked_softmax_backward_fn", "batch_norm_backward_fn",
                         "rnn_cell_backward_fn"}


def test_every_family_relying_on_a_ban_has_one():
    assert {f.id.split("/")[-1] for f in FAMILIES if f.banned} == BANNED_FAMILIES
    assert {f.id.split("/")[-1] for f in FAMILIES if f.own_gradient} == OWN_GRADIENT_FAMILIES


UNDER_THE_BAN = """
import sys, torch
from ptenv.grader import grade_outputs
from ptenv.inside import ban
from ptenv.tasks.functions import as_outputs, call
from ptenv.tasks.tiers import find_family
family = find_family(sys.argv[1])[1]
source = family.by_hand
cases = [(name, args, as_outputs(call(family.reference, family.name, args))) for name, args in family.draw("host", 8)]
autograd = not family.own_gradient
ban.remove(tuple(family.banned), autograd=autograd)
with open("/proc/self/mem", "r+b", buffering=0) as memory:
    ban.seal(memory, autograd)  # as the caller does: ctypes (and autograd for a backward) trap from here
for name, args, expected in cases:
    print(name, grade_outputs(as_outputs(call(source, family.name, args)), expected).reason)
"""


@pytest.mark.parametrize("family", HELD, ids=lambda f: f.id)
def test_the_honest_implementation_runs_under_the_ban_on_the_host(family):
    """The quick check of what the sandbox test below runs in a caller: in a child process with the
    ban installed and sealed, the honest implementation matches the reference on 8 cases."""
    reply = subprocess.run([sys.executable, "-c", UNDER_THE_BAN, family.id], capture_output=True, text=True,
                           timeout=240)
    assert reply.returncode == 0, reply.stderr[-3000:]
    assert [line.rsplit(" ", 1)[-1] for line in reply.stdout.splitlines()] == ["match"] * 8, reply.stdout


BANNED_CALL = """
import sys, torch
from ptenv.inside import ban
from ptenv.tasks.functions import call
from ptenv.tasks.tiers import find_family
family = find_family(sys.argv[1])[1]
name, args = family.draw("ban-reason", 1)[0]
ban.remove(tuple(family.banned), autograd=not family.own_gradient)
try:
    call(family.reference, family.name, args)
    print("ran")
except RuntimeError as e:
    print(e)
"""


@pytest.mark.parametrize("family", [f for f in BANNED if "by_hand" in f.also_correct], ids=lambda f: f.id)
def test_a_banned_call_raises_an_error_that_names_the_ban(family):
    """The reference calls a banned op: under the ban (in a child process) the call raises, naming it."""
    reply = subprocess.run([sys.executable, "-c", BANNED_CALL, family.id], capture_output=True, text=True, timeout=120)
    assert NAMES_THE_BAN in reply.stdout, reply.stdout + reply.stderr[-2000:]
    assert reply.stdout.startswith("aten::"), reply.stdout


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_under_its_ban_no_aten_op_computes_the_contract_whole():
    """For each banned family, every aten op overload, bound every plausible way to cases of each
    mode: none reproduces the reference once the ban is in. (Without the ban the same search finds
    what `banned` lists.) Two families at a time, one child each: the searches are CPU-bound."""
    def search(family):
        found, _ = op_search.search(family.id, ban=True, timeout=3000)
        return [f"{family.id} {f.mode}: {f.op}({f.binding})" for f in found]
    with ThreadPoolExecutor(2) as pool:
        found = [line for lines in pool.map(search, BANNED) for line in lines]
    assert not found, "\n".join(found)


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.timeout(1200)
async def test_an_honest_implementation_passes_every_hidden_case_under_the_ban(box):
    """All the banned families in one sandbox: each honest implementation passes all 8 hidden cases
    at level 2; a reference that calls a banned op scores 0 with the ban as its reason."""
    failures = []
    for family in HELD:
        cases = CASES.of(family, 5)
        outcome = await assess_function(box.client.call, box.id, source=family.by_hand, name=family.name, cases=cases,
                                        ban=family.ban(2), limits=box.client.limits, partial_credit=False)
        if (outcome.verdict.score, outcome.scoring_error) != (1.0, None):
            failures.append(f"{family.id}: {outcome.verdict.reason} {outcome.scoring_error}")
        if "by_hand" in family.also_correct:
            outcome = await assess_function(box.client.call, box.id, source=family.reference, name=family.name, cases=cases,
                                            ban=family.ban(2), limits=box.client.limits, partial_credit=False)
            if outcome.verdict.score != 0.0 or NAMES_THE_BAN not in outcome.verdict.reason:
                failures.append(f"{family.id}: the reference under the ban: {outcome.verdict.reason}")
    assert not failures, "\n".join(failures)


def test_the_threat_model_lists_the_families_whose_banned_op_has_a_python_decomposition():
    """Pasting a decomposition read during the rollout is open (docs/threat-model.md); the list of
    families exposed that way is torch's decomposition table's, not a guess."""
    from torch._decomp import decomposition_table
    listed = re.search(r"exposed this way.*?:\n(.*?)\n- ", THREAT_MODEL.read_text(), re.S).group(1)

    def exposed(family):
        return any(getattr(getattr(torch.ops.aten, p), o) in decomposition_table
                   for p in family.banned for o in getattr(torch.ops.aten, p).overloads())
    assert re.findall(r"`([\w/]+_fn)`", listed) == [f.id for f in BANNED if exposed(f)]
