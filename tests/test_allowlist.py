"""The allowlist of a function family's hardest level (ptenv/tasks/allowed.py, ptenv/inside/allowlist.py)
is closed and fair.

Fair: every family has one, and an honest implementation (the reference, or its `by_hand`
reimplementation where the reference calls an op the allowlist leaves out) passes every hidden case
under it, on the host (forked children, each with its family's allowlist installed and sealed) and in a
real sandbox's caller. Closed: an op left out raises an error that names the rule; and with a family's
allowlist installed, the op search (tests/support/op_search.py) finds no op that computes its
contract, or one mode of it, whole, alone or as a view of its output."""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ptenv.host.assess import assess_function
from ptenv.tasks.functions import HiddenCases
from ptenv.tasks.tiers import FUNCTION_TIERS
from tests.support import op_search

FAMILIES = [family for members in FUNCTION_TIERS.values() for family in members]
CASES = HiddenCases("test-allowlist", 8)
NAMES_THE_RULE = "is not on this task's allowlist"
# Families whose contract an op every answer needs computes whole, so that no allowlist can leave it
# out: the contract is a cast (`Tensor.to` truncates toward zero), and their hardest level differs
# from level 1 only by what else it removes (docs/threat-model.md). The packets that cast: `_to_copy`
# and what calls it (`to`, `_cast_*`, `to_dense` given a dtype), and `chain_matmul.out`, whose one
# matrix is copied (`copy_`) into the integer out= tensor.
PLUMBING = {"tensor_ops/cast_trunc_int_fn": {"_to_copy", "to", "_cast_Int", "_cast_Long", "_cast_Short", "to_dense",
                                             "chain_matmul"}}
THREAT_MODEL = Path(__file__).parent.parent / "docs" / "threat-model.md"


# The packets a group allows that an answer reaches without writing their names: operators, indexing,
# and the ops torch's own functions are made of (`Tensor.reshape` is `_reshape_alias`, `x.item()` is
# `_local_scalar_dense`); every other packet the question must name, or an answer that needs it (a
# budget's `addcmul`, `as_strided`) is one a careful solver would not dare to write.
UNNAMED = {
    "add": "+", "sub": "-", "rsub": "-", "mul": "*", "div": "/", "true_divide": "/", "floor_divide": "//",
    "remainder": "%", "pow": "**", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "bitwise_not": "~",
    "sgn": "sign", "clamp_min": "clamp", "clamp_max": "clamp", "clip": "clamp",
    "_foreach_mul": "*", "_foreach_add": "+", "_foreach_div": "/", "_foreach_norm": "norm",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "_unsafe_view": "view", "_reshape_alias": "reshape", "alias": "view", "t": ".T", "slice": "x[a:b:s]",
    "split_with_sizes": "split", "unsafe_split": "split", "unsafe_split_with_sizes": "split",
    "lift_fresh": "torch.tensor", "view_as_real": "view", "view_as_complex": "view", "_unsafe_index": "x[i]",
    "constant_pad_nd": "F.pad", "empty_strided": "empty", "empty_permuted": "empty", "new_empty_strided": "new_*",
    "scalar_tensor": "torch.tensor", "copy": "copy_", "_to_copy": ".to(dtype)", "_copy_from": "copy_",
    "_copy_from_and_resize": "copy_", "fill": "fill_", "zero": "zero_", "resize": "new_*", "resize_as": "new_*",
    "_local_scalar_dense": "item", "lift": "torch.tensor", "lift_fresh_copy": "torch.tensor",
    "_assert_async": "item", "_assert_scalar": "item", "_functional_assert_async": "item",
    "_assert_tensor_metadata": ".to(dtype)", "_stack": "torch.stack", "index": "x[i]", "index_put": "x[i] = v",
    "_index_put_impl": "x[i] = v", "embedding": "F.embedding", "linalg_vector_norm": "norm", "_is_all_true": "all",
    "_is_any_true": "any", "_softmax": "torch.softmax", "_log_softmax": "torch.log_softmax",
    "_safe_softmax": "torch.softmax", "scatter_add": "scatter", "is_nonzero": "item", "empty_like": "*_like",
    "zeros_like": "*_like", "ones_like": "*_like", "full_like": "*_like", "new_empty": "new_*", "new_zeros": "new_*",
    "new_ones": "new_*", "new_full": "new_*",
}


def test_the_question_names_every_op_it_allows():
    """An op the allowlist lets run is one the question names, or reaches by the operator or function
    UNNAMED says, which the question names in turn."""
    from ptenv.tasks.allowed import BASE, LOGSUMEXP, MASK, MATMUL, SCATTER, SOFTMAX, SORT

    groups = (*BASE, MATMUL, SORT, SOFTMAX, SCATTER, MASK, LOGSUMEXP)
    said = [text for group in groups for text in re.findall(r"`([^`]*)`", group.says)]
    unnamed = [f"{op} ({UNNAMED.get(op, op)})" for group in groups for op in group.ops
               if not any(UNNAMED.get(op, op) in text for text in said)]
    assert not unnamed, "the question does not name: " + ", ".join(unnamed)


def test_every_family_has_an_allowlist_at_its_hardest_level_only():
    for family in FAMILIES:
        assert family.allowlist(1) is None, family.id
        rules = family.allowlist(2)
        assert rules["autograd"] is not family.own_gradient, family.id
        assert all(op.startswith("aten::") for op in rules["allow"]), family.id
        banned = {f"aten::{op}" for op in family.banned}
        assert not banned & set(rules["allow"]), family.id


UNDER_THE_ALLOWLIST = """
import os, sys, torch
torch.set_num_threads(1)
from ptenv.grader import grade_outputs
from ptenv.inside import allowlist
from ptenv.tasks.functions import as_outputs, call
from ptenv.tasks.tiers import find_family
for family_id in sys.argv[1:]:
    family = find_family(family_id)[1]
    cases = [(name, args, as_outputs(call(family.reference, family.name, args))) for name, args in family.draw("host", 8)]
    r, w = os.pipe()
    if os.fork() == 0:  # the allowlist is for good: a child per family, as a caller is
        rules = family.allowlist(2)
        allowlist.install(set(rules["allow"]))
        allowlist.remove_libraries()
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            allowlist.seal(memory, rules["autograd"])
        lines = []
        for name, args, expected in cases:
            try:
                lines.append(grade_outputs(as_outputs(call(family.by_hand, family.name, args)), expected).reason)
            except Exception as e:
                lines.append(f"{type(e).__name__}: {e}")
        os.write(w, "".join(f"{family.id} {name}: {line}\\n" for (name, _, _), line in zip(cases, lines)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as out:
        print(out.read(), end="", flush=True)
    os.wait()
"""


def test_the_honest_implementation_runs_under_the_allowlist_on_the_host():
    """The quick check of what the sandbox test below runs in a caller: with each family's allowlist
    installed and sealed, its honest implementation matches the reference on 8 cases."""
    reply = subprocess.run([sys.executable, "-c", UNDER_THE_ALLOWLIST, *(f.id for f in FAMILIES)], capture_output=True,
                           text=True, timeout=600)
    assert reply.returncode == 0, reply.stderr[-3000:]
    lines = reply.stdout.splitlines()
    assert len(lines) == 8 * len(FAMILIES), reply.stdout[-3000:] + reply.stderr[-3000:]
    assert [line for line in lines if not line.endswith(": match")] == []


OFF_THE_LIST = """
import sys, torch
from ptenv.inside import allowlist
from ptenv.tasks.tiers import find_family
allowlist.install(set(find_family(sys.argv[1])[1].allowlist(2)["allow"]))
x = torch.arange(6.0).reshape(2, 3)
for attempt in (lambda: torch.cumsum(x, 0), lambda: x.unfold(1, 2, 1), lambda: torch.ops.mkldnn._convolution_pointwise,
                lambda: torch.nn.functional.unfold(x[None, None], 2), lambda: x.to_sparse(), lambda: torch.segment_reduce(x, "sum", lengths=torch.tensor([1, 1])),
                lambda: torch.sparse_coo_tensor(torch.tensor([[0, 0]]), torch.tensor([1.0, 2.0]), (2,)).coalesce(),
                lambda: torch.nested.nested_tensor([x, x]), lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
                lambda: x.to_mkldnn(), lambda: torch.empty(2, layout=torch.sparse_coo)):
    try:
        value = attempt()
        print("ran", type(value).__name__)
    except RuntimeError as e:
        print(str(e).splitlines()[0])
"""


def test_an_op_off_the_list_raises_an_error_that_names_it():
    """Off the list of a family that allows scatters and sorts: a scan, a window view, convolution,
    segment reduction, and every path to a sparse, nested, quantized or mkldnn tensor."""
    reply = subprocess.run([sys.executable, "-c", OFF_THE_LIST, "tensor_ops/topk_keep_fn"], capture_output=True, text=True,
                           timeout=120)
    lines = reply.stdout.splitlines()
    assert len(lines) == 11, reply.stdout + reply.stderr[-2000:]
    assert lines[2] == "ran OpOverloadPacket"  # looking an op up is not calling it
    for line in lines[:2] + lines[3:]:
        assert re.match(r"aten::\w+(\.\w+)? (is not on this task's allowlist|has no \w+ path on this task's allowlist)",
                        line), line


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_under_its_allowlist_no_op_computes_the_contract_whole():
    """For each family, every op overload (all namespaces), bound every plausible way to cases of each
    mode, its outputs compared as they are and as views (any permutation of their dims, reshaped):
    none reproduces the reference once the family's allowlist is in, but what PLUMBING names. Two
    families at a time, one child each: the searches are CPU-bound."""
    def search(family):
        found, _ = op_search.search(family.id, allowlist=True, timeout=3000)
        return [f"{family.id} {f.mode}: {f.op}({f.binding})" for f in found if f.packet() not in PLUMBING.get(family.id, ())]
    with ThreadPoolExecutor(2) as pool:
        found = [line for lines in pool.map(search, FAMILIES) for line in lines]
    assert not found, "\n".join(found)


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.timeout(1200)
async def test_an_honest_implementation_passes_every_hidden_case_under_the_allowlist(box):
    """Every family in one sandbox: each honest implementation passes all 8 hidden cases at level 2;
    a reference that calls an op the allowlist leaves out scores 0 with the rule as its reason."""
    failures = []
    for family in FAMILIES:
        cases = CASES.of(family, 5)
        inputs = family.instance("t", 5, 2).inputs()
        outcome = await assess_function(box.client.call, box.id, source=family.by_hand, name=family.name, inputs=inputs,
                                        cases=cases, allowlist=family.allowlist(2), limits=box.client.limits,
                                        partial_credit=False)
        if (outcome.verdict.score, outcome.scoring_error) != (1.0, None):
            failures.append(f"{family.id}: {outcome.verdict.reason} {outcome.scoring_error}")
        if "by_hand" in family.also_correct:
            outcome = await assess_function(box.client.call, box.id, source=family.reference, name=family.name,
                                            inputs=inputs, cases=cases, allowlist=family.allowlist(2),
                                            limits=box.client.limits, partial_credit=False)
            if outcome.verdict.score != 0.0 or NAMES_THE_RULE not in outcome.verdict.reason:
                failures.append(f"{family.id}: the reference under the allowlist: {outcome.verdict.reason}")
    assert not failures, "\n".join(failures)


def test_the_threat_model_lists_the_families_whose_contract_plumbing_computes():
    open_items = THREAT_MODEL.read_text().split("Open, and why:")[1]
    assert all(f"`{family_id}`" in open_items for family_id in PLUMBING)
