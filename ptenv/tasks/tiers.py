"""Which task instances a split holds, from the tiers, the number of examples and the seed.

Instance seeds: the k-th instance of a family is seed `seed * 1_000_000 + 2 * k`, plus 1 in the test
split, so train and test never share an instance, whatever arguments they were built with; held-out
families appear in the test split only. The basic tier's default train set is the 45 canonical tasks.
"""

from ptenv.tasks.families import BasicFamily, canonical_instance
from ptenv.tasks.canonical import TASKS
from ptenv.tasks import advanced, expert, fn_advanced, fn_basic, fn_expert, fn_intermediate, intermediate
from ptenv.tasks import efficiency
from ptenv.tasks.functions import LEVELS

TIERS = {
    "basic": [BasicFamily(task) for task in TASKS],
    "intermediate": intermediate.FAMILIES,
    "advanced": advanced.FAMILIES,
    "expert": expert.FAMILIES,
}
# The function form of each tier (ptenv/tasks/functions.py): the model writes a function, graded on hidden inputs.
FUNCTION_TIERS = {
    "basic": fn_basic.FAMILIES,
    "intermediate": fn_intermediate.FAMILIES,
    "advanced": fn_advanced.FAMILIES,
    "expert": fn_expert.FAMILIES,
}
KINDS = ("result", "function")
SPLITS = ("train", "test")
DEFAULT_PER_FAMILY = {"train": 10, "test": 5}  # the default set of a generated tier
BASIC_TEST_PER_FAMILY = 1
MAX_EXAMPLES = 100_000
MAX_SEED = 999_999
SEED_STRIDE = 1_000_000  # > 2 * MAX_EXAMPLES, so different `seed` arguments never share an instance


def parse_tiers(tiers) -> list[str]:
    names = [tiers] if isinstance(tiers, str) else tiers
    if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names) \
            or not all(isinstance(n, str) and n in TIERS for n in names):
        raise ValueError(f"tiers must be one of {', '.join(map(repr, TIERS))} or a list of them, got {tiers!r}")
    return names


def check_arguments(split, num_examples, seed, num_name: str = "num_train_examples") -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if type(num_examples) is not int or not (num_examples == -1 or 1 <= num_examples <= MAX_EXAMPLES):
        raise ValueError(f"{num_name} must be -1 (the default set) or an integer from 1 to {MAX_EXAMPLES}, "
                         f"got {num_examples!r}")
    if type(seed) is not int or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")


def check_num_eval_examples(num_eval_examples, split) -> None:
    if type(num_eval_examples) is not int or not -1 <= num_eval_examples <= MAX_EXAMPLES:
        raise ValueError(f"num_eval_examples must be 0 (no eval dataset), -1 (the default set) or an integer from "
                         f"1 to {MAX_EXAMPLES}, got {num_eval_examples!r}")
    if num_eval_examples and split == "test":
        raise ValueError("num_eval_examples serves the test split as the eval dataset; with split='test' the "
                         "dataset is the test split already: leave num_eval_examples at 0")


def check_kind(kind, level, tiers: list[str]) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    if kind == "function":
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(map(str, LEVELS))}, got {level!r}")
        if not any(FUNCTION_TIERS[t] for t in tiers):
            raise ValueError(f"no function families in tiers {tiers}: those with some are "
                             f"{[t for t, f in FUNCTION_TIERS.items() if f]}")


def instance_seed(seed: int, k: int, split: str) -> int:
    return seed * SEED_STRIDE + 2 * k + (split == "test")


def families(tier: str, split: str, kind: str = "result", level: int = 1) -> list:
    """The tier's families on this split (held-out ones in the test split only); at the efficiency
    level, those that have it."""
    catalogue = TIERS if kind == "result" else FUNCTION_TIERS
    return [f for f in catalogue[tier] if (split == "test" or not f.held_out)
            and (level != efficiency.LEVEL or efficiency.has_level(f))]


def parse_families(chosen, tiers: list[str], split: str, kind: str, level: int = 1) -> set[str] | None:
    """The family ids `chosen` names (None: every family of the tiers), each one of the tiers' on this split."""
    if chosen is None:
        return None
    names = [chosen] if isinstance(chosen, str) else chosen
    offered = [f.id for tier in tiers for f in families(tier, split, kind, level)]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in offered for n in names):
        raise ValueError(f"families must be a family id of the {kind} form of tiers {tiers} on the {split} split "
                         f"(held-out families are in the test split only; level {efficiency.LEVEL} has the families "
                         f"that trace), or a list of them, got {chosen!r}")
    return set(names)


def select(tiers: list[str], split: str, num_examples: int, seed: int, kind: str = "result", level: int = 1,
           chosen: set[str] | None = None) -> list:
    """The split's instances: `num_examples` of them round-robin over the tiers' families (those
    `chosen`, if given), or with -1 each tier's default set (basic train: the canonical tasks;
    basic test: one per family; the function form of every tier: as a generated tier's). A family
    keeps its instances whichever others are chosen with it."""
    def nth(pool: list, i: int):
        tier, family = pool[i % len(pool)]
        seed_i = instance_seed(seed, i // len(pool), split)
        return family.instance(tier, seed_i) if kind == "result" else family.instance(tier, seed_i, level)

    def offered(tier: str) -> list:
        return [f for f in families(tier, split, kind, level) if chosen is None or f.id in chosen]

    if num_examples != -1:
        pool = [(tier, family) for tier in tiers for family in offered(tier)]
        return [nth(pool, i) for i in range(num_examples)]
    picked = []
    for tier in tiers:
        if tier == "basic" and split == "train" and kind == "result":
            picked += [canonical_instance(task) for task in TASKS if chosen is None or task.id in chosen]
            continue
        pool = [(tier, family) for family in offered(tier)]
        per_family = BASIC_TEST_PER_FAMILY if tier == "basic" and kind == "result" else DEFAULT_PER_FAMILY[split]
        picked += [nth(pool, i) for i in range(per_family * len(pool))]
    return picked


def allowlist_base() -> list[str]:
    """Every op some function family's hardest level allows: the trial zygote installs the
    allowlist of these once (ptenv/inside/main.py), and each trial narrows it to its family's."""
    levels = [f.allowlist(2) for families in FUNCTION_TIERS.values() for f in families]
    return sorted({op for level in levels if level for op in level["allow"]})


def find_family(family_id: str):
    """(tier, family) for a family id; KeyError naming it when there is none."""
    for catalogue in (TIERS, FUNCTION_TIERS):
        for tier, members in catalogue.items():
            for family in members:
                if family.id == family_id:
                    return tier, family
    raise KeyError(f"no family {family_id!r}")
