"""docs/function-tasks.md's recipe for adding a function family, followed with a tiny family of this
test's own. Each numbered step of the recipe is done here as the recipe says, on the real code and
on temporary copies of what it writes (the split manifest, the docs), and each is shown to be
needed: the check it feeds fails before the step and passes after it. The recipe's numbered steps
must be exactly these, in this order, so a step dropped from the doc, or one the code stops
needing, fails here."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import build_tasks
from ptenv.tasks import fn_basic, functions, splits, tiers
from ptenv.tasks.families import normal, randint, uniform
from ptenv.tasks.functions import Case, FunctionFamily
from tests import test_allowlist, test_docs, test_function_families

ROOT = Path(__file__).resolve().parents[1]
TIER = "basic"
TIER_FAMILIES = fn_basic.FAMILIES  # the list the recipe's step 2 adds to (tiers.FUNCTION_TIERS[TIER] is it)


def _softplus(g, scale=2.0, large=False, dtype=torch.float32):
    shape = (randint(g, 2, 4), randint(g, 3, 6))
    x = uniform(g, -50.0, 50.0, *shape, dtype=dtype) if large else normal(g, *shape, scale=scale, dtype=dtype)
    return {"x": x, "grad_out": normal(g, *shape, dtype=dtype)}


# Small on purpose: a backward whose op torch computes whole, so that every step of the recipe applies.
FAMILY = FunctionFamily(
    "autograd/softplus_backward_fn", "softplus_backward", ("x", "grad_out"),
    "`x` is a float tensor of shape (R, C) (float32 or float64) and `grad_out` a tensor like `x`. Return the "
    "tuple (grad_x,) holding the gradient of sum(grad_out * softplus(x)) with respect to x, where softplus(x) "
    "= log(1 + exp(x)): that is grad_out * sigmoid(x), shaped and typed like x. Entries of `x` may be large, "
    "up to 50 in magnitude.",
    (
        Case("typical", "the gradient of sum(grad_out * softplus(x))", lambda g: _softplus(g)),
        Case("large inputs", "up to 50 in magnitude", lambda g: _softplus(g, large=True)),
        Case("float64 input", "float32 or float64", lambda g: _softplus(g, dtype=torch.float64)),
    ),
    "def softplus_backward(x, grad_out):\n"
    "    return (torch.ops.aten.softplus_backward(grad_out, x, 1.0, 20.0),)\n",
    wrong={
        "sigmoid_derivative":
            "def softplus_backward(x, grad_out):\n"
            "    s = torch.sigmoid(x)\n"
            "    return (grad_out * s * (1 - s),)\n",
        "no_grad_out":
            "def softplus_backward(x, grad_out):\n"
            "    return (torch.sigmoid(x),)\n",
    },
    also_correct={
        "by_hand":
            "def softplus_backward(x, grad_out):\n"
            "    return (grad_out * torch.sigmoid(x),)\n",
    },
    hint="the derivative of softplus is the sigmoid.",
    own_gradient=True,
)
# The contract's words as code (the recipe's step 3 adds it to also_correct).
LITERAL = ("def softplus_backward(x, grad_out):\n"
           "    return (grad_out / (1 + torch.exp(-x)),)\n")
# With the family's allowlist installed and sealed, as a caller has it: the op its reference calls.
OFF_THE_LIST = """
import sys, torch
from ptenv.inside import allowlist
from ptenv.tasks.tiers import find_family
allowlist.install(set(find_family(sys.argv[1])[1].allowlist(2)["allow"]))
x = torch.ones(2, 3)
try:
    torch.ops.aten.softplus_backward(x, x, 1.0, 20.0)
    print("ran")
except RuntimeError as e:
    print(str(e).splitlines()[0])
"""


def recipe_steps(text: str) -> list[str]:
    """The titles (in bold) of the numbered steps of the recipe, in order."""
    start = text.index("\n## Adding a family")
    recipe = text[start:text.index("\n## ", start + 1)]
    return re.findall(r"^\d+\. \*\*(.+?)\*\*", recipe, re.M)


class Recipe:
    """The steps, done in order on shared state: the docs as the steps edit them (in memory) and the
    temporary split manifest."""

    def __init__(self, monkeypatch, tmp_path: Path):
        self.patch, self.tmp = monkeypatch, tmp_path
        self.edited: dict[str, str] = {}
        monkeypatch.setattr(test_docs, "read_doc", self.read)

    def read(self, doc: str) -> str:
        return self.edited.get(doc) or (ROOT / doc).read_text()

    def write_the_family(self):
        with pytest.raises(KeyError):
            tiers.find_family(FAMILY.id)  # a new id
        assert re.fullmatch(r"[a-z_]+/[a-z0-9_]+_fn", FAMILY.id)
        assert 3 <= len(FAMILY.cases) <= 8 and 2 <= len(FAMILY.wrong) <= 4 and FAMILY.hint
        assert FAMILY.allowed == () and FAMILY.banned == ()  # BASE is this contract's allowlist

    def add_it_to_the_tiers_families(self):
        assert FAMILY not in tiers.families(TIER, "train", "function")
        TIER_FAMILIES.append(FAMILY)  # undone by the fixture
        assert tiers.find_family(FAMILY.id) == (TIER, FAMILY)
        assert tiers.FUNCTION_TIERS[TIER][-1] is FAMILY

    def write_the_literal(self):
        with pytest.raises((KeyError, AssertionError)):
            test_function_families.test_every_family_lists_a_literal_implementation_of_its_signature(FAMILY)
        self.replace_family(dataclasses.replace(FAMILY, also_correct={**FAMILY.also_correct, "literal": LITERAL}))
        test_function_families.test_every_family_lists_a_literal_implementation_of_its_signature(FAMILY)

    def set_the_allowlist_fields(self):
        # Without own_gradient level 2 would leave autograd, which computes the contract from softplus
        # written in allowed ops; the reference's op is off the allowlist, so by_hand is what passes.
        assert dataclasses.replace(FAMILY, own_gradient=False).allowlist(2)["autograd"] is True
        assert FAMILY.allowlist(1) is None and FAMILY.allowlist(2)["autograd"] is False
        assert "aten::softplus_backward" not in FAMILY.allowlist(2)["allow"]
        question = FAMILY.instance(TIER, 0, 2).row()["question"]
        assert "only these operations run" in question and "Automatic differentiation is removed" in question
        assert FAMILY.by_hand == FAMILY.also_correct["by_hand"] != FAMILY.reference
        self.patch.setattr(test_allowlist, "FAMILIES", [*test_allowlist.FAMILIES, FAMILY])
        test_allowlist.test_every_family_has_an_allowlist_at_its_hardest_level_only()

    def replace_family(self, family):
        """The family, rebuilt with a field the recipe adds, in place in the tier's list."""
        global FAMILY
        if FAMILY in TIER_FAMILIES:
            TIER_FAMILIES[TIER_FAMILIES.index(FAMILY)] = family
        FAMILY = family

    def run_the_gates(self):
        family_checks = [test_function_families.test_the_contract_states_every_hidden_case_class,
                         test_function_families.test_hidden_sets_pass_the_gates_for_many_keys,
                         test_function_families.test_every_wrong_implementation_fails_a_case_of_every_kept_set,
                         test_function_families.test_every_other_correct_implementation_passes_every_kept_set,
                         test_function_families.test_the_literal_never_forces_a_redraw,
                         test_function_families.test_rows_are_byte_identical_and_parse]
        for check in family_checks:
            check(FAMILY)
        checks, rows = build_tasks.check_function_family(TIER, FAMILY, 2)
        assert all(c.ok for c in checks) and len(rows) == 2 * len(functions.LEVELS), checks
        # The gates gate: a family whose "wrong" implementation is right has no set to keep.
        with pytest.raises(ValueError, match="passes every case"):
            functions.gated_draw(dataclasses.replace(FAMILY, wrong={"right": FAMILY.by_hand}), "gate", 8)
        # tests/test_allowlist.py's quick checks, on this family (registered in the child as here): by_hand
        # matches the reference on 8 cases under the sealed allowlist; the reference's op is off it.
        register = (f"from ptenv.tasks import fn_{TIER}\nfrom tests.test_family_recipe import FAMILY, LITERAL\n"
                    f"import dataclasses\nfn_{TIER}.FAMILIES.append(dataclasses.replace(FAMILY, also_correct="
                    f"{{**FAMILY.also_correct, 'literal': LITERAL}}))\n")
        for script, expect in ((test_allowlist.UNDER_THE_ALLOWLIST, lambda out: [line.rsplit(" ", 1)[-1] for line in out.splitlines()]
                                == ["match"] * 8),
                               (OFF_THE_LIST, lambda out: out.startswith("aten::softplus_backward ")
                                and test_allowlist.NAMES_THE_RULE in out)):
            done = subprocess.run([sys.executable, "-c", register + script, FAMILY.id], capture_output=True, text=True,
                                  timeout=240, cwd=ROOT)
            assert done.returncode == 0 and expect(done.stdout), done.stdout + done.stderr[-2000:]

    def rewrite_the_split_manifest(self):
        # Only this tier's function sets can change, and generating the others costs about 10 s: the
        # manifest here holds just those.
        names = [(name, kwargs) for name, kwargs in splits.set_names() if name.startswith("function/")
                 and name.split("/")[2] == TIER]
        self.patch.setattr(splits, "set_names", lambda: names)
        committed = splits.load()
        manifest = self.tmp / "splits.json"
        manifest.write_text(splits.dumps({name: committed[name] for name, _ in names}))
        self.patch.setattr(splits, "MANIFEST", manifest)
        changed = splits.check()
        assert changed and all(FAMILY.id in line or "another order" in line for line in changed), changed
        assert any(f"{FAMILY.id}@0: new row" in line for line in changed), changed
        assert not build_tasks.verify_manifest()
        assert build_tasks.main(["--manifest"]) == 0
        assert splits.check() == [] and build_tasks.verify_manifest()

    def update_the_counts(self):
        readme = self.read("README.md")
        row = re.search(rf"^\| `{TIER}` \|.*\| (\d+): (\d+) / (\d+) \|$", readme, re.M)
        stale = test_docs.false_claims(self.read)
        assert stale and all(line.startswith(f"README.md:{test_docs.line_of(readme, row.start())}: ") for line in stale), stale
        counts = (f"{len(tiers.FUNCTION_TIERS[TIER])}: {test_docs.default_rows(TIER, 'train', 'function')} / "
                  f"{test_docs.default_rows(TIER, 'test', 'function')}")
        self.edited["README.md"] = readme.replace(row.group(0), row.group(0)[:row.start(1) - row.start(0)] + counts + " |")
        assert test_docs.false_claims(self.read) == []

    def say_what_changed(self):
        with pytest.raises(AssertionError, match="does not name the split version"):
            test_docs.test_the_changelog_names_the_current_split_version()
        changelog = self.read("CHANGELOG.md")
        entry = (f"- `{FAMILY.id}`, a function family of the {TIER} tier.\n\n#### Split changes\n\n"
                 f"- `{splits.split_version(splits.MANIFEST)}`: the {TIER} tier's function sets gained its rows.\n\n")
        self.edited["CHANGELOG.md"] = changelog.replace("\n## 0.", "\n" + entry + "## 0.", 1)
        test_docs.test_the_changelog_names_the_current_split_version()


# The recipe's steps, as its numbered titles say them, and how this test does each.
STEPS = [
    ("Write the family", Recipe.write_the_family),
    ("Add it to the tier's `FAMILIES`", Recipe.add_it_to_the_tiers_families),
    ("Write the literal", Recipe.write_the_literal),
    ("Set the allowlist fields", Recipe.set_the_allowlist_fields),
    ("Run the gates", Recipe.run_the_gates),
    ("Rewrite the split manifest", Recipe.rewrite_the_split_manifest),
    ("Update the counts", Recipe.update_the_counts),
    ("Say what changed", Recipe.say_what_changed),
]


def test_the_recipe_numbers_exactly_the_steps_this_test_follows():
    assert recipe_steps((ROOT / "docs" / "function-tasks.md").read_text()) == [title for title, _ in STEPS]


@pytest.fixture
def recipe(monkeypatch, tmp_path):
    global FAMILY
    first = FAMILY
    yield Recipe(monkeypatch, tmp_path)
    if FAMILY in TIER_FAMILIES:
        TIER_FAMILIES.remove(FAMILY)
    FAMILY = first
    splits.split_version.cache_clear()  # it may hold the temporary manifest's version


@pytest.mark.timeout(600)
def test_following_the_recipe_adds_a_family_that_every_check_accepts(recipe):
    for title, step in STEPS:
        try:
            step(recipe)
        except BaseException as e:
            raise AssertionError(f"the recipe's step {title!r} failed") from e
