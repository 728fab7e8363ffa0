"""Task families, tiers and splits: determinism, disjoint splits, arguments, provenance and the gates."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ptenv.tasks import tiers
from ptenv.tasks.rows import TASK_ID, dumps_rows, parse_row
from ptenv.tasks.families import (MAX_DRAWS, Family, Instance, canonical_instance, first_gradable, normal, randint,
                            rewarded_shortcuts)
from ptenv.grader import dtype_family, grade
from tests.support.policy_server import rows_by_question
from ptenv.tasks.source import DEFAULT_DATASET, load_tasks
from ptenv.tasks.canonical import CATEGORIES, TASKS
from ptenv.tasks.expert import _nucleus_walk

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("build_tasks", ROOT / "build_tasks.py")
build_tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_tasks)

NEW_TIERS = [t for t in tiers.TIERS if t != "basic"]


def test_at_least_two_new_tiers_with_thirty_families_and_unique_well_formed_ids():
    assert len(NEW_TIERS) >= 2 and sum(len(tiers.TIERS[t]) for t in NEW_TIERS) >= 30
    assert [f.id for f in tiers.TIERS["basic"]] == [t.id for t in TASKS]
    ids = [f.id for members in tiers.TIERS.values() for f in members]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z_]+/[a-z0-9_]+", i) and i.split("/")[0] in CATEGORIES for i in ids)
    for tier in NEW_TIERS:  # each new tier holds some families out of train entirely
        assert any(f.held_out for f in tiers.TIERS[tier]) and not all(f.held_out for f in tiers.TIERS[tier])


def test_new_tier_instructions_state_the_maths_not_a_torch_call():
    for tier in NEW_TIERS:
        for family in tiers.TIERS[tier]:
            does = family.instance(tier, 0).does
            assert "torch." not in does and "$" not in does, family.id


def test_the_same_family_and_seed_give_the_same_bytes_in_another_process():
    picks = [(tier, members[i % len(members)].id, 2 * i + 1) for i, (tier, members) in enumerate(tiers.TIERS.items())]
    here = dumps_rows([tiers.find_family(f)[1].instance(t, s).row() for t, f, s in picks])
    script = ("import sys, json\nfrom ptenv.tasks import tiers\nfrom ptenv.tasks.rows import dumps_rows\n"
              f"picks = {picks!r}\n"
              "sys.stdout.write(dumps_rows([tiers.find_family(f)[1].instance(t, s).row() for t, f, s in picks]))\n")
    for hash_seed in ("1", "2"):  # Python's salted hash() must play no part
        there = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=120).stdout
        assert there == here


def test_different_seeds_give_different_inputs():
    family = tiers.find_family("nn_modules/causal_padded_attention")[1]
    a, b = family.instance("intermediate", 0), family.instance("intermediate", 2)
    assert a.id == "nn_modules/causal_padded_attention@0" and b.id.endswith("@2")
    assert a.inputs["q"].shape != b.inputs["q"].shape or not torch.equal(a.inputs["q"], b.inputs["q"])


def test_basic_families_redraw_sizes_and_parameters_but_keep_what_the_instruction_names():
    by_id = {t.id: t for t in TASKS}
    fit = [tiers.find_family("optim/adam_step")[1].instance("basic", s) for s in range(1, 40, 2)]
    canonical_shapes = {name: t.shape for name, t in canonical_instance(by_id["optim/adam_step"]).inputs.items()}
    assert any({n: t.shape for n, t in i.inputs.items()} != canonical_shapes for i in fit)
    assert all(i.inputs["w"].shape[1] == i.inputs["x"].shape[1] and i.inputs["y"].shape == (i.inputs["x"].shape[0],
               i.inputs["w"].shape[0]) for i in fit)  # sizes that must agree still agree
    changed = [i for i in fit if i.params["0.99"] != "0.99"]
    assert changed and all(f"betas=({i.params['0.9']}, {i.params['0.99']})" in i.does + i.solution for i in changed)
    assert all(i.does.count("betas=(") == 1 and i.solution.count("betas=(") == 1 for i in fit)
    blocks = [tiers.find_family("tensor_ops/reshape_blocks")[1].instance("basic", s) for s in (1, 3)]
    assert all(i.inputs["x"].shape == (4, 6) for i in blocks)  # its instruction names the sizes
    casts = {tiers.find_family("tensor_ops/cast_trunc_int32")[1].instance("basic", s).row()["question"].split(
        "dtype ")[-1].split(" ")[0] for s in range(1, 40, 2)}
    assert casts == {"torch.int16", "torch.int32", "torch.int64"}  # dtypes vary where they mean something


def test_a_varied_literal_changes_in_the_instruction_wherever_it_changes_in_the_solution():
    # A value drawn anew must be the one the model is told: the instruction and the reference
    # solution say the same thing, wherever the literal stands (a sentence's full stop included).
    whole = r"(?<![\w.]){}(?!\w|\.\d)"
    for task in (t for t in TASKS if t.vary):
        family = tiers.find_family(task.id)[1]
        for seed in range(1, 12, 2):
            instance = family.instance("basic", seed)
            for literal, value in instance.params.items():
                for text in (task.does, task.solution):
                    count = len(re.findall(whole.format(re.escape(literal)), text))
                    after = instance.does if text is task.does else instance.solution
                    assert len(re.findall(whole.format(re.escape(value)), after)) >= count, (task.id, literal, value, after)


def ids(tier_names, split, num, seed=0):
    return [i.id for i in tiers.select(tier_names, split, num, seed)]


def test_train_and_test_never_share_an_instance_and_held_out_families_are_test_only():
    everything = list(tiers.TIERS)
    train = set(ids(everything, "train", -1) + ids(everything, "train", 400) + ids(everything, "train", 400, seed=1))
    test = set(ids(everything, "test", -1) + ids(everything, "test", 400) + ids(everything, "test", 400, seed=1))
    assert not train & test
    held_out = {f.id for members in tiers.TIERS.values() for f in members if f.held_out}

    def family(task_id):
        return task_id.split("@")[0]

    assert not {family(i) for i in train} & held_out
    assert held_out <= {family(i) for i in test}
    assert not set(ids(["intermediate"], "train", 50, seed=0)) & set(ids(["intermediate"], "train", 50, seed=1))


def test_chosen_families_keep_their_instances_and_a_wrong_id_fails_in_one_line():
    new = ["tensor_ops/trimmed_mean_fn", "nn_modules/soft_pool2d_fn"]
    chosen = tiers.parse_families(new, ["intermediate", "advanced"], "test", "function")
    picked = [i.id for i in tiers.select(["intermediate", "advanced"], "test", -1, 0, "function", 2, chosen)]
    everything = [i.id for i in tiers.select(["intermediate", "advanced"], "test", -1, 0, "function", 2)]
    assert {i.split("@")[0] for i in picked} == set(new)
    assert picked == [i for i in everything if i.split("@")[0] in new]  # the same instances, in the same order
    three = [i.id for i in tiers.select(["intermediate", "advanced"], "test", 3, 0, "function", 2, chosen)]
    assert three == [f"{new[0]}@1~2", f"{new[1]}@1~2", f"{new[0]}@3~2"]
    assert tiers.parse_families(None, ["basic"], "train", "result") is None
    for wrong in ("tensor_ops/no_such_fn", ["nn_modules/soft_pool2d_fn"] * 0, 3):
        with pytest.raises(ValueError, match="families must be a family id") as e:
            tiers.parse_families(wrong, ["intermediate"], "test", "function")
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="families must be"):  # a tier's family, but not of the tiers given
        tiers.parse_families(new, ["intermediate"], "test", "function")


def test_default_sets_and_explicit_sizes():
    assert ids(["basic"], "train", -1) == [t.id for t in TASKS]
    assert ids(["basic"], "test", -1) == [f"{t.id}@1" for t in TASKS]
    for tier in NEW_TIERS:
        members = tiers.TIERS[tier]
        trainable = [f for f in members if not f.held_out]
        assert len(ids([tier], "train", -1)) == tiers.DEFAULT_PER_FAMILY["train"] * len(trainable)
        assert len(ids([tier], "test", -1)) == tiers.DEFAULT_PER_FAMILY["test"] * len(members)
    seven = ids(["intermediate", "advanced"], "train", 7)
    assert len(seven) == 7 and seven[0] == f"{tiers.TIERS['intermediate'][0].id}@0"
    assert list(tiers.TIERS) == ["basic", "intermediate", "advanced", "expert"]
    expert = tiers.TIERS["expert"]  # the hardest tier: at least 14 families, 2 of them held out
    assert len(expert) >= 14 and sum(f.held_out for f in expert) == 2
    assert (len(ids(["expert"], "train", -1)), len(ids(["expert"], "test", -1))) == (10 * (len(expert) - 2), 5 * len(expert))


def test_defaults_load_the_bundled_canonical_rows():
    rows = load_tasks()
    assert [r.task_id for r in rows] == [t.id for t in TASKS]
    assert all(r.provenance() == {"tier": "basic", "family": r.task_id, "seed": None} for r in rows)


@pytest.mark.parametrize("tier", ["advanced", "expert"])
def test_generated_rows_carry_provenance_and_round_trip_through_the_strict_parser(tier):
    (instance,) = tiers.select([tier], "test", 1, 3)
    row = instance.row()
    info = row["info"]
    assert (info["tier"], info["family"], info["seed"]) == (tier, instance.family, 3_000_001)
    assert info["task_id"] == f"{instance.family}@3000001" and TASK_ID.fullmatch(info["task_id"])
    parsed = parse_row(json.loads(json.dumps(row)), "row")
    assert parsed.provenance() == {"tier": tier, "family": instance.family, "seed": 3_000_001}
    broken = {**row, "info": {**info, "seed": "3"}}
    with pytest.raises(ValueError, match=r"^row: info: tier and family must be strings and seed an integer or null$"):
        parse_row(broken, "row")


@pytest.mark.parametrize("kwargs, message", [
    ({"tiers": "master"}, "tiers must be one of 'basic', 'intermediate', 'advanced', 'expert' or a list of them, "
                          "got 'master'"),
    ({"tiers": ["basic", "basic"]}, "tiers must be one of 'basic', 'intermediate', 'advanced', 'expert' or a list of them"),
    ({"split": "validation"}, "split must be 'train' or 'test', got 'validation'"),
    ({"num_examples": 0}, "num_train_examples must be -1 (the default set) or an integer from 1 to 100000, got 0"),
    ({"num_examples": 2.5}, "num_train_examples must be -1 (the default set) or an integer from 1 to 100000, got 2.5"),
    ({"seed": -1}, "seed must be an integer from 0 to 999999, got -1"),
    ({"dataset_name": "someone/fork", "tiers": "advanced"}, "a fork (someone/fork) serves its own rows"),
    ({"dataset_name": "someone/fork", "families": "tensor_ops/reshape_blocks"}, "a fork (someone/fork) serves its own rows"),
    ({"tiers": "advanced", "families": ["tensor_ops/reshape_blocks"]}, "families must be a family id of the result form "
                                                                       "of tiers ['advanced'] on the train split"),
])
def test_bad_arguments_are_one_line_saying_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError) as e:
        load_tasks(**{"dataset_name": DEFAULT_DATASET, **kwargs})
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("num_eval_examples, split, message", [
    (-2, "train", "num_eval_examples must be 0 (no eval dataset), -1 (the default set) or an integer from 1 to 100000"),
    (5, "test", "with split='test' the dataset is the test split already: leave num_eval_examples at 0"),
])
def test_bad_eval_size_is_one_line(num_eval_examples, split, message):
    with pytest.raises(ValueError) as e:
        tiers.check_num_eval_examples(num_eval_examples, split)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_verify_passes_a_fixed_sample_of_variants_of_every_family():
    proc = subprocess.run([sys.executable, str(ROOT / "build_tasks.py"), "--verify", "--variants", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    families = sum(len(m) for m in tiers.TIERS.values()) + sum(len(m) for m in tiers.FUNCTION_TIERS.values())
    assert f"{families} families x 2 variants: {families} passed, 0 failed; 0 duplicate rows" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("ok   split manifest")


def instance(solution: str, independent: str | None = None, x=None) -> Instance:
    x = torch.linspace(-3.0, 3.0, 13) if x is None else x
    return Instance("nn_modules/synthetic@0", "intermediate", "nn_modules/synthetic", 0, "synthetic", {"x": x},
                    solution, independent)


def failed(checks) -> dict:
    return {c.name: c.detail for c in checks if not c.ok}


def test_the_tolerance_gate_fails_a_reference_a_float64_answer_would_fail():
    # torch's float32 GELU kernel is 1e-4 off (relative) at x = -3, where the exact formula is not.
    assert "float64" in failed(build_tasks.check_instance(instance("result = torch.nn.GELU()(x)\n")))
    assert failed(build_tasks.check_instance(instance("result = 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))\n"))) == {}


def test_the_tolerance_gate_fails_an_independent_formulation_the_tolerance_rejects():
    exact = "result = torch.exp(x)\n"
    assert failed(build_tasks.check_instance(instance(exact, "result = torch.exp(x)\n"))) == {}
    reason = failed(build_tasks.check_instance(instance(exact, "result = torch.exp(x) * (1 + 1e-4)\n")))["independent"]
    assert "beyond tolerance" in reason


def test_a_family_the_tolerance_can_never_grade_fails_with_one_line():
    def sample(g):
        return {}, {"x": normal(g, randint(g, 3, 5))}

    family = Family("nn_modules/never_gradable", "synthetic", sample, "result = torch.exp(x)\n",
                    "result = torch.exp(x) * (1 + 1e-4)\n")
    with pytest.raises(ValueError, match=rf"^nn_modules/never_gradable@4: no gradable draw in {MAX_DRAWS} "):
        family.instance("advanced", 4)
    assert first_gradable(lambda n: instance("result = torch.exp(x)\n")).id == "nn_modules/synthetic@0"


def test_duplicate_rows_are_caught():
    rows = [instance("result = torch.exp(x)\n").row(), instance("result = torch.exp(x)\n").row()]
    assert build_tasks.duplicate_rows(rows) == ["nn_modules/synthetic@0"]
    other = instance("result = torch.exp(x)\n", x=torch.linspace(-3.0, 3.0, 14)).row()
    assert build_tasks.duplicate_rows([rows[0], other]) == []


SHORTCUT_FAMILIES = [f.id for t in tiers.TIERS for f in tiers.families(t, "test") if f.shortcuts]


def test_the_families_declare_their_plausible_mistakes_as_shortcuts():
    assert len(SHORTCUT_FAMILIES) >= 24
    assert {"tensor_ops/top_k_top_p_sampling", "tensor_ops/band_mask"} <= set(SHORTCUT_FAMILIES)


@pytest.mark.parametrize("family_id", SHORTCUT_FAMILIES)
def test_each_shortcut_is_a_near_miss_the_grader_rejects(family_id):
    # A tensor of the answer's rank and kind (so the check is not vacuous), graded 0 on every instance.
    tier, family = tiers.find_family(family_id)
    for split in tiers.SPLITS:
        for k in range(3):
            inst = family.instance(tier, tiers.instance_seed(0, k, split))
            expected = build_tasks.run_solution(inst.solution, inst.inputs, inst.id).detach()
            for name, code in inst.shortcuts.items():
                answer = build_tasks.run_solution(code, inst.inputs, inst.id).detach()
                assert answer.dim() == expected.dim(), (inst.id, name)
                assert dtype_family(answer.dtype) == dtype_family(expected.dtype), (inst.id, name)
                assert grade(answer, expected).score == 0.0, (inst.id, name)


def test_top_k_top_p_sampling_is_never_solved_by_greedy_decoding_or_a_single_filter():
    # Before the shortcuts, greedy decoding passed 8% of these instances and top-k alone 59%.
    tier, family = tiers.find_family("tensor_ops/top_k_top_p_sampling")
    for split in tiers.SPLITS:
        for k in range(100):
            inst = family.instance(tier, tiers.instance_seed(0, k, split))
            expected = build_tasks.run_solution(inst.solution, inst.inputs, inst.id)
            assert rewarded_shortcuts(inst, expected) == [], inst.id


def test_the_sampling_shortcuts_are_the_procedures_they_name():
    # Each shortcut agrees with the float64 procedure run with its filter switched off, so the gate is real.
    tier, family = tiers.find_family("tensor_ops/top_k_top_p_sampling")
    for seed in range(10):
        inst = family.instance(tier, seed)
        logits, u, k, p = inst.inputs["logits"], inst.inputs["u"], inst.params["k"], float(inst.params["p"])
        probs = torch.softmax(logits.double() / float(inst.params["temp"]), -1)
        v = logits.shape[1]
        assert build_tasks.run_solution(inst.shortcuts["greedy"], inst.inputs, inst.id).tolist() == \
            probs.argmax(-1).tolist()
        for name, (kk, pp) in {"no_filter": (v, 1.0), "top_k_only": (k, 1.0), "top_p_only": (v, p)}.items():
            tokens, gap = _nucleus_walk(probs, u.double(), kk, pp)
            if gap > 1e-4:  # far enough from every boundary for float32 to take the same branches
                assert build_tasks.run_solution(inst.shortcuts[name], inst.inputs, inst.id).tolist() == tokens, name


def flagged_family(shortcut: str) -> Family:
    def sample(g):
        return {"flag": randint(g, 0, 1)}, {"x": normal(g, randint(g, 3, 5))}

    return Family("nn_modules/flagged", "synthetic", sample, "result = torch.exp(x)\n", shortcuts={"s": shortcut})


def test_a_draw_whose_shortcut_earns_the_reward_is_redrawn():
    family = flagged_family("result = torch.exp(x) if $flag else x\n")
    assert any(family._draw("advanced", seed, 0).params["flag"] for seed in range(10))
    assert all(family.instance("advanced", seed).params["flag"] == 0 for seed in range(10))
    with pytest.raises(ValueError, match="the grader accepts this shortcut"):
        flagged_family("result = torch.exp(x)\n").instance("advanced", 0)


def test_the_build_check_fails_an_instance_whose_shortcut_earns_the_reward():
    inst = instance("result = torch.exp(x)\n")
    assert failed(build_tasks.check_instance(replace(inst, shortcuts={"wrong": "result = x\n"}))) == {}
    reason = failed(build_tasks.check_instance(replace(inst, shortcuts={"same": "result = x.exp()\n"})))
    assert reason == {"shortcuts": "grader accepts same"}


def test_the_policy_server_serves_rows_that_share_an_instruction_only_with_one_solution(tmp_path):
    rows = [r.row() for r in tiers.select(["basic"], "test", 2 * len(TASKS), 0)]  # two instances of each family
    path = tmp_path / "rows.jsonl"
    path.write_text(dumps_rows(rows))
    served = rows_by_question(path)
    assert len(served) < len(rows)
    assert all(served[r["question"]]["info"]["reference_solution"] == r["info"]["reference_solution"] for r in rows)
    clash = {**rows[0], "info": {**rows[0]["info"], "reference_solution": "result = x\n"}}
    path.write_text(dumps_rows([rows[0], clash]))
    with pytest.raises(ValueError, match="duplicate question with another solution"):
        rows_by_question(path)
