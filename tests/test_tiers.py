"""Task families, tiers and splits: determinism, disjoint splits, arguments, provenance and the gates."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from string import Template

import pytest
import torch

from ptenv import tiers
from ptenv.dataset import TASK_ID, dumps_rows, parse_row
from ptenv.families import MAX_DRAWS, Family, Instance, canonical_instance, first_gradable, normal, randint
from ptenv.grader import grade
from ptenv.policy_server import rows_by_question
from ptenv.session_ns import new_namespace
from ptenv.source import DEFAULT_DATASET, load_tasks
from ptenv.tasks import CATEGORIES, TASKS

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
    script = ("import sys, json\nfrom ptenv import tiers\nfrom ptenv.dataset import dumps_rows\n"
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
    family = lambda task_id: task_id.split("@")[0]  # noqa: E731
    assert not {family(i) for i in train} & held_out
    assert held_out <= {family(i) for i in test}
    assert not set(ids(["intermediate"], "train", 50, seed=0)) & set(ids(["intermediate"], "train", 50, seed=1))


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
    families = sum(len(m) for m in tiers.TIERS.values())
    assert f"{families} families x 2 variants: {families} passed, 0 failed; 0 duplicate rows" in proc.stdout


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


# Plausible mistakes on the new tiers; each must fail, so the tasks test the understanding they state.
NEAR_MISSES = {
    "nn_modules/batch_norm_training":
        "rm, rv = running_mean.clone(), running_var.clone()\n"
        "y = torch.nn.functional.batch_norm(x, rm, rv, weight, bias, training=True, momentum=1 - $momentum, eps=$eps)\n"
        "result = torch.cat([y.flatten(), rm, rv])\n",
    "nn_modules/causal_padded_attention":
        "scores = (q @ k.transpose(1, 2)) / $d ** 0.5\n"
        "allowed = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).tril()\n"
        "result = torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1) @ v\n",
    "tensor_ops/division_modes":
        "q = torch.div(a, b, rounding_mode='trunc')\nresult = torch.stack([q, a - b * q, q, a - b * q])\n",
    "losses/label_smoothing_ce":
        "result = torch.stack([torch.nn.functional.cross_entropy(l, t, ignore_index=-100) for l, t in zip(logits, target)])\n",
    "optim/adamw_written_out":
        "w = torch.nn.Parameter(w.clone())\n"
        "opt = torch.optim.Adam([w], lr=$lr, betas=($beta1, $beta2), eps=$eps, weight_decay=$wd)\n"
        "for _ in range($steps):\n    opt.zero_grad()\n    ((x @ w - y) ** 2).mean().backward()\n    opt.step()\n"
        "result = w.detach().clone()\n",
    "nn_modules/gru_from_weights":
        "h, outs = h0, []\n"
        "for xt in x:\n"
        "    ir, iz, in_ = (xt @ w_ih.T + b_ih).chunk(3, dim=1)\n"
        "    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=1)\n"
        "    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)\n"
        "    h = z * torch.tanh(in_ + r * hn) + (1 - z) * h\n"
        "    outs.append(h)\n"
        "result = torch.stack(outs)\n",
    # expert: the convention for unequal micro-batches, an IoU exactly at the threshold, float32 sums about a
    # large offset, exp(-rate * lo) underflowing even in float64, and the kv-head grouping.
    "optim/accumulated_adamw_clip_schedule":
        "import math\n"
        "W, b = torch.nn.Parameter(W.clone()), torch.nn.Parameter(b.clone())\n"
        "opt = torch.optim.AdamW([{'params': [W], 'weight_decay': $wd}, {'params': [b], 'weight_decay': 0.0}],\n"
        "                        lr=$lr, betas=($beta1, $beta2), eps=$eps)\n"
        "for t in range($steps):\n"
        "    lr_t = $lr * (t + 1) / $warmup if t < $warmup else "
        "$lr_min + 0.5 * ($lr - $lr_min) * (1 + math.cos(math.pi * (t - $warmup) / ($steps - $warmup)))\n"
        "    for group in opt.param_groups:\n        group['lr'] = lr_t\n"
        "    opt.zero_grad()\n"
        "    ((X[t] @ W.T + b - Y[t]) ** 2).mean().backward()\n"
        "    torch.nn.utils.clip_grad_norm_([W, b], $max_norm)\n"
        "    opt.step()\n"
        "result = torch.cat([W.detach().flatten(), b.detach()])\n",
    "tensor_ops/class_aware_nms":
        "x1, y1, x2, y2 = boxes.unbind(1)\n"
        "area = (x2 - x1) * (y2 - y1)\n"
        "iw = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)\n"
        "ih = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)\n"
        "iou = iw * ih / (area[:, None] + area[None] - iw * ih)\n"
        "suppress = (iou >= $thr) & (classes[:, None] == classes[None])\n"
        "alive, kept = torch.ones(len(scores), dtype=torch.bool), []\n"
        "for i in torch.sort(-scores, stable=True).indices.tolist():\n"
        "    if alive[i]:\n        kept.append(i)\n        alive &= ~suppress[i]\n"
        "result = torch.tensor(kept)\n",
    "tensor_ops/segment_weighted_variance":
        "W1 = torch.zeros($s).index_add(0, seg, w)\n"
        "W2 = torch.zeros($s).index_add(0, seg, w ** 2)\n"
        "count = torch.zeros($s).index_add(0, seg, torch.ones_like(w))\n"
        "mean = torch.zeros($s).index_add(0, seg, w * x) / W1.clamp(min=1e-30)\n"
        "ss = torch.zeros($s).index_add(0, seg, w * (x - mean[seg]) ** 2)\n"
        "result = torch.where(count > 1, ss / torch.where(count > 1, W1 - W2 / W1, 1.0), 0.0)\n",
    "losses/censored_exponential_nll":
        "rate, l, h = eta.double().exp(), lo.double(), hi.double()\n"
        "interval = -torch.log(torch.exp(-rate * l) - torch.exp(-rate * h))\n"
        "result = torch.where(kind == 0, rate * l - eta, torch.where(kind == 1, rate * l, interval)).float()\n",
    "nn_modules/gqa_rope_kv_cache":
        "B, T, E = x.shape\n"
        "P = k_cache.shape[2]\n"
        "def rope(t):\n"
        "    angle = torch.arange(P, P + T)[:, None] * $base ** (-2 * torch.arange($half) / $dh)\n"
        "    a, c = t[..., :$half], t[..., $half:]\n"
        "    return torch.cat([a * angle.cos() - c * angle.sin(), a * angle.sin() + c * angle.cos()], -1)\n"
        "heads = lambda m, n: (x @ m.T).reshape(B, T, n, $dh).transpose(1, 2)\n"
        "q, k, v = rope(heads(wq, $hq)), rope(heads(wk, $hkv)), heads(wv, $hkv)\n"
        "keys = torch.cat([k_cache, k], 2).repeat(1, $group, 1, 1)\n"
        "values = torch.cat([v_cache, v], 2).repeat(1, $group, 1, 1)\n"
        "scores = q @ keys.transpose(-1, -2) / $dh ** 0.5\n"
        "cache_ok = (torch.arange(P)[None, :] >= pad[:, None])[:, None, :].expand(B, T, P)\n"
        "causal = torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, T, T)\n"
        "allowed = torch.cat([cache_ok, causal], -1)[:, None]\n"
        "weights = torch.softmax(scores.masked_fill(~allowed, float('-inf')), -1)\n"
        "result = (weights @ values).transpose(1, 2).reshape(B, T, $hq * $dh) @ wo.T\n",
}


@pytest.mark.parametrize("family_id", NEAR_MISSES)
def test_near_miss_solutions_fail_on_new_tiers(family_id):
    tier, family = tiers.find_family(family_id)
    for seed in (0, 1, 2):
        inst = family.instance(tier, seed)
        namespace = new_namespace(inst.inputs)
        exec(Template(NEAR_MISSES[family_id]).substitute(inst.params), namespace)
        expected = build_tasks.run_solution(inst.solution, inst.inputs, inst.id)
        assert grade(namespace["result"].detach().clone(), expected.detach()).score == 0.0, (family_id, seed)


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
