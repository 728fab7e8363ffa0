"""Which task instances a split holds, from the tiers, the number of examples and the seed.

Instance seeds: the k-th instance of a family is seed `seed * 1_000_000 + 2 * k`, plus 1 in the test
split, so train and test never share an instance, whatever arguments they were built with; held-out
families appear in the test split only. The basic tier's default train set is the 45 canonical tasks.
"""

from ptenv.tasks.families import BasicFamily, Instance, canonical_instance
from ptenv.tasks.canonical import TASKS
from ptenv.tasks import advanced, expert, intermediate

TIERS = {
    "basic": [BasicFamily(task) for task in TASKS],
    "intermediate": intermediate.FAMILIES,
    "advanced": advanced.FAMILIES,
    "expert": expert.FAMILIES,
}
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


def instance_seed(seed: int, k: int, split: str) -> int:
    return seed * SEED_STRIDE + 2 * k + (split == "test")


def families(tier: str, split: str) -> list:
    return [f for f in TIERS[tier] if split == "test" or not f.held_out]


def select(tiers: list[str], split: str, num_examples: int, seed: int) -> list[Instance]:
    """The split's instances: `num_examples` of them round-robin over the tiers' families, or with
    -1 each tier's default set (basic train: the canonical tasks; basic test: one per family)."""
    if num_examples != -1:
        pool = [(tier, family) for tier in tiers for family in families(tier, split)]
        return [_nth(pool, i, split, seed) for i in range(num_examples)]
    chosen = []
    for tier in tiers:
        if tier == "basic" and split == "train":
            chosen += [canonical_instance(task) for task in TASKS]
            continue
        pool = [(tier, family) for family in families(tier, split)]
        per_family = BASIC_TEST_PER_FAMILY if tier == "basic" else DEFAULT_PER_FAMILY[split]
        chosen += [_nth(pool, i, split, seed) for i in range(per_family * len(pool))]
    return chosen


def _nth(pool: list, i: int, split: str, seed: int) -> Instance:
    tier, family = pool[i % len(pool)]
    return family.instance(tier, instance_seed(seed, i // len(pool), split))


def find_family(family_id: str):
    """(tier, family) for a family id; KeyError naming it when there is none."""
    for tier, members in TIERS.items():
        for family in members:
            if family.id == family_id:
                return tier, family
    raise KeyError(f"no family {family_id!r}")
