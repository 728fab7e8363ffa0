"""The allowlist against answers that try to get a removed computation anyway (issues 26 and 35): every
answer of tests/support/ban_answers.py (at the hardest level of GRID_SAMPLE and LAYER_NORM_BACKWARD)
and of tests/support/allowlist_answers.py (issue 35's five classes, over nine families) fails its
hidden cases with a reason that names the allowlist, as the model's failure (never a scoring
error); compositions of allowed ops are graded on their merits; the honest controls pass; and at
level 1 (no allowlist) the op itself passes. In a real sandbox, several trials to a sandbox;
then through the real classic vf-eval (the 0.4 line's run is in tests/test_v1_env.py)."""

import json

import pytest

from ptenv.host import answer
from ptenv.host.assess import assess_function
from ptenv.tasks import tiers
from ptenv.tasks.functions import HiddenCases
from tests.support import allowlist_answers, ban_answers
from tests.support.ban_answers import ANSWERS, FAMILIES, HONEST, LEVEL_1
from tests.support.policy_server import serve_in_thread
from tests.support.vf_eval import leftover_sandboxes, run_eval

CASES = HiddenCases("ban-test-secret", 8)
SEED = 3


async def trial(box, key, source: str, level: int):
    family = FAMILIES[key] if isinstance(key, str) else key
    instance = family.instance("expert", SEED, level)
    found = answer.function_source(f"```python\n{source}```", family.name)
    return await assess_function(box.client.call, box.id, source=found, name=family.name, inputs=instance.inputs(),
                                 cases=CASES.of(family, SEED), allowlist=family.allowlist(level),
                                 limits=box.client.limits, partial_credit=False)


def miss(name: str, outcome) -> str | None:
    """How a hostile answer's outcome falls short of a failure that names the allowlist (None: it does not)."""
    verdict = outcome.verdict
    if outcome.scoring_error is None and verdict.score == 0.0 and "allowlist" in verdict.reason:
        return None
    return f"{name}: score {verdict.score}, scoring_error {outcome.scoring_error!r}, reason {verdict.reason!r}"


@pytest.mark.slow
@pytest.mark.rootless
@pytest.mark.timeout(900)
async def test_every_way_around_the_allowlist_fails_naming_it(box):
    misses = []
    answers = {**ANSWERS, **{name: (family, cls, source) for name, (family, cls, source) in allowlist_answers.ANSWERS.items()}}
    for name, (key, _, source) in answers.items():
        outcome = await trial(box, key, source, 2)
        print(f"{name}: {outcome.verdict.score} {outcome.verdict.reason}")
        if (why := miss(name, outcome)) is not None:
            misses.append(why)
    assert (await box.cell("print('alive')")).stdout == "alive\n"  # the sandbox still answers
    assert misses == [], "answers that got around the allowlist or failed without naming it:\n" + "\n".join(misses)


@pytest.mark.slow
@pytest.mark.rootless
async def test_compositions_of_allowed_ops_are_graded_on_their_merits(box):
    """torch's Python decompositions, called or pasted, run as the allowed ops they are made of."""
    for name, (_, source) in ban_answers.COMPOSITIONS.items():
        outcome = await trial(box, "grid", source, 2)
        assert (outcome.verdict.score, outcome.scoring_error) == (1.0, None), (name, outcome.verdict.reason)
    for name, (family, source) in allowlist_answers.COMPOSITIONS.items():
        outcome = await trial(box, family, source, 2)
        assert outcome.scoring_error is None and "allowlist" not in outcome.verdict.reason, (name, outcome.verdict.reason)
        assert "NaN" in outcome.verdict.reason, (name, outcome.verdict.reason)


@pytest.mark.slow
@pytest.mark.rootless
async def test_honest_answers_pass_under_the_allowlist_and_the_op_passes_without_it(box):
    for name, (key, _, source) in HONEST.items():
        outcome = await trial(box, key, source, 2)
        assert (outcome.verdict.score, outcome.scoring_error) == (1.0, None), (name, outcome.verdict.reason)
    for name, (key, _, source) in LEVEL_1.items():
        outcome = await trial(box, key, source, 1)  # the allowlist is the hardest level's only
        assert (outcome.verdict.score, outcome.scoring_error) == (1.0, None), (name, outcome.verdict.reason)
        outcome = await trial(box, key, source, 2)
        assert outcome.verdict.score == 0.0 and "allowlist" in outcome.verdict.reason, (name, outcome.verdict.reason)


# --- through the real vf-eval ---------------------------------------------------------------------

# The rows played: among the expert function tier's first instances (twice round its families),
# GRID_SAMPLE's two and LAYER_NORM_BACKWARD's first; the policy plays the family's answers in turn.
ROWS = 2 * len(tiers.FUNCTION_TIERS["expert"])
INSTANCES = tiers.select(["expert"], "train", ROWS, 0, "function", 2)
PLAYED = tuple([i for i, x in enumerate(INSTANCES) if x.family is FAMILIES["grid"]][:2]
               + [i for i, x in enumerate(INSTANCES) if x.family is FAMILIES["layer_norm"]][:1])
ROLLOUTS = 19  # per row, at least each of its family's answers once (PLAYS: 33 for GRID_SAMPLE over its 2 rows, 16 for LAYER_NORM_BACKWARD)


def shuffle_seed() -> int:
    """Classic vf-eval cannot name rows: it takes the first -n of the dataset shuffled under
    --shuffle-seed (datasets' shuffle). The first seed that puts PLAYED first."""
    import datasets

    rows = datasets.Dataset.from_dict({"i": list(range(ROWS))})
    return next(seed for seed in range(1_000_000) if sorted(rows.shuffle(seed=seed)["i"][:len(PLAYED)]) == sorted(PLAYED))


def played_rows(path) -> list[dict]:
    assert len(PLAYED) == 3
    path.write_text("".join(json.dumps(i.row()) + "\n" for i in INSTANCES))
    return [INSTANCES[i] for i in PLAYED]


def check_played(rows: list[tuple[str, dict, float, str | None]]) -> None:
    """(answer played, verdict, reward, scoring error) per rollout: every answer of both families
    played; each hostile one 0.0 with the allowlist named, each honest one 1.0, no scoring error."""
    assert {name for name, *_ in rows} == {*ANSWERS, *HONEST}
    misses = []
    for name, verdict, reward, error in rows:
        if name in HONEST:
            assert (reward, error) == (1.0, None), (name, verdict)
        elif error is not None or reward != 0.0 or "allowlist" not in verdict["reason"]:
            misses.append(f"{name}: reward {reward}, scoring_error {error!r}, reason {verdict['reason']!r}")
    assert misses == [], "answers that got around the allowlist or failed without naming it:\n" + "\n".join(sorted(set(misses)))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_vf_eval_scores_every_way_around_the_allowlist_zero(tmp_path):
    played = played_rows(tmp_path / "rows.jsonl")
    url, stop = serve_in_thread(tmp_path / "rows.jsonl")
    args = ["-a", json.dumps({"kind": "function", "level": 2, "tiers": "expert", "num_train_examples": ROWS}),
            "-n", str(len(PLAYED)), "-r", str(ROLLOUTS), "-c", "6", "--shuffle", "--shuffle-seed", str(shuffle_seed())]
    try:
        _, results = run_eval(url, "ban_hostile", args, tmp_path / "out")
    finally:
        stop()
    assert not leftover_sandboxes()
    assert len(results) == len(PLAYED) * ROLLOUTS
    assert {row["info"]["task_id"] for row in results} == {i.id for i in played}
    check_played([(ban_answers.played(row["completion"][-1]["content"]), row["verdict"], row["reward"],
                   row["scoring_error"]) for row in results])
