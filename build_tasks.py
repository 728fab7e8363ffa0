"""Build the dataset from the task catalogue, or verify every task and family.

    python build_tasks.py --out train.jsonl          # write the rows (byte-identical across runs)
    python build_tasks.py --verify                   # one line per canonical task with each check
    python build_tasks.py --verify --variants 4      # and 4 seeded instances of every family
                                                     # (function families: 4 hidden sets, rows of each level)
    python build_tasks.py --manifest                 # rewrite ptenv/tasks/splits.json (the split manifest)

A task passes when its reference runs cleanly and returns a real-valued tensor that is
deterministic, finite, non-empty, different from every input and exactly round-trips through the
codec, and when the real grader scores 0 for every degenerate answer (zeros, ones, the mean as a
constant, each input passed through, the float16-rounded reference) unless the entry justifies it,
and for every shortcut its family declares (a plausible wrong procedure, such as greedy decoding
for a sampling task).
Two more checks say the tolerance is not too tight: the reference recomputed in float64 and cast
down passes, and so does the family's independent formulation where it has one. A generated
instance must also come out byte-identical when generated again, and no two rows (the canonical
ones and every variant, train and test) may share both instruction and inputs.
--verify also generates the default sets of every tier and checks them against the split manifest
(ptenv/tasks/splits.py), naming every row that changed.
"""

import argparse
import hashlib
import json
import random
import sys
import time
from typing import NamedTuple

import torch

from ptenv.inside import codec
from ptenv.tasks.host_state import reference_run
from ptenv.tasks.rows import dumps_rows, run_solution, write_rows
from ptenv.tasks.families import Instance, canonical_instance, other_formulations, rewarded_shortcuts
from ptenv.grader import dtype_family, grade
from ptenv.tasks.canonical import TASKS, Task
from ptenv.tasks import efficiency, functions, splits
from ptenv.tasks.tiers import FUNCTION_TIERS, SPLITS, TIERS, instance_seed


RESEED = 20_240_607  # the global RNGs' seed for the determinism check's second run


class Check(NamedTuple):
    name: str
    ok: bool
    detail: str = ""  # the problem when failed; for the degenerate gate, the answers tried when passed


def _check(name: str, ok: bool, problem: str) -> Check:
    return Check(name, ok, "" if ok else problem)


def degenerate_answers(expected: torch.Tensor, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Answers a task must not accept: constants, inputs passed through, and a lower-precision reference."""
    mean = expected.to(torch.float64).mean()
    answers = {
        "zeros": torch.zeros_like(expected),
        "ones": torch.ones_like(expected),
        "mean": mean.expand(expected.shape).to(expected.dtype),
    }
    for name, tensor in inputs.items():
        if tensor.shape == expected.shape and dtype_family(tensor.dtype) == dtype_family(expected.dtype):
            answers[f"input:{name}"] = tensor
    if expected.is_floating_point():
        answers["float16"] = expected.to(torch.float16).to(expected.dtype)
    return answers


def check_task(task: Task) -> list[Check]:
    try:
        instance = canonical_instance(task)
    except Exception as e:
        return [Check("runs", False, _one_line(e))]
    return check_instance(instance)


def check_instance(instance: Instance) -> list[Check]:
    """Run every check on one instance; later checks are skipped once the reference itself is unusable."""
    inputs = instance.inputs
    try:
        result, again = _run(instance.solution, instance), _run_reseeded(instance.solution, instance)
    except Exception as e:
        return [Check("runs", False, _one_line(e))]
    checks = [Check("runs", True)]
    try:
        encoded = codec.encode(result)
    except codec.CodecError as e:
        return checks + [Check("tensor", False, _one_line(e))]
    if result.is_complex():
        return checks + [Check("tensor", False, f"complex dtype {result.dtype}")]
    checks.append(Check("tensor", True))
    checks.append(_check("deterministic", _encodes_equal(again, encoded), "second run differs"))
    checks.append(_check("finite", bool(torch.isfinite(result).all()), "NaN or inf in the answer"))
    checks.append(_check("non_empty", result.numel() > 0, "answer has no elements"))
    same = [name for name, t in inputs.items()
            if t.shape == result.shape and torch.equal(t.to(torch.float64), result.detach().to(torch.float64))]
    checks.append(_check("non_identity", not same, f"answer equals input {', '.join(same)}"))
    expected = codec.decode(json.loads(json.dumps(encoded)))
    exact = expected.dtype == result.dtype and expected.shape == result.shape and codec.encode(expected) == encoded
    checks.append(_check("round_trip", exact and grade(expected, expected).score == 1.0, "decoded answer differs"))
    if expected.numel():
        checks.append(_degenerate_check(instance, expected, inputs))
        if instance.shortcuts:
            rewarded = rewarded_shortcuts(instance, expected)
            checks.append(_check("shortcuts", not rewarded, f"grader accepts {', '.join(rewarded)}"))
        # Another correct way to the answer must pass too: else the tolerance fails correct answers.
        for name, problem in other_formulations(instance, expected).items():
            checks.append(Check(name, problem is None, problem or ""))
    return checks


def _run(solution: str, instance: Instance):
    return run_solution(solution, instance.inputs, instance.id)


def _run_reseeded(solution: str, instance: Instance):
    """The run again from other global RNG states: each run starts from the host's states and puts
    them back (ptenv.tasks.host_state), so a reference that draws from them unseeded would otherwise
    repeat itself."""
    with reference_run():
        torch.manual_seed(RESEED)
        random.seed(RESEED)
        return _run(solution, instance)


def _degenerate_check(task, expected: torch.Tensor, inputs: dict[str, torch.Tensor]) -> Check:
    answers = degenerate_answers(expected, inputs)
    passing = {name for name, answer in answers.items() if grade(answer, expected).score != 0.0}
    let_through = sorted(passing - set(task.degenerate_ok))
    stale = sorted(set(task.degenerate_ok) - passing)
    if let_through:
        return Check("degenerate", False, f"grader accepts {', '.join(let_through)}")
    if stale:
        return Check("degenerate", False, f"degenerate_ok lists {', '.join(stale)} but the grader rejects it")
    return Check("degenerate", True, ",".join(answers))


def _encodes_equal(tensor, encoded: dict) -> bool:
    try:
        return codec.encode(tensor) == encoded
    except codec.CodecError:
        return False


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _describe(checks: list[Check]) -> str:
    return " ".join(f"{c.name}:{'ok' if c.ok else 'FAIL'}" + (f"({c.detail})" if c.detail else "") for c in checks)


def variant_seeds(family, variants: int) -> list[tuple[str, int]]:
    """(split, seed) of a family's first `variants` instances, alternating train and test."""
    splits = ["test"] if family.held_out else list(SPLITS)
    return [(split, instance_seed(0, k // len(splits), split))
            for k, split in zip(range(variants), splits * variants)]


def check_family(tier: str, family, variants: int) -> tuple[list[Check], list[dict]]:
    """The checks of the family's first failing variant (or of its last one), and every variant's row."""
    rows, checks = [], []
    for split, seed in variant_seeds(family, variants):
        instance = family.instance(tier, seed)
        checks = check_instance(instance)
        if all(c.ok for c in checks):
            row = instance.row()
            checks.append(_check("reproducible", dumps_rows([family.instance(tier, seed).row()]) == dumps_rows([row]),
                                 "a second generation differs"))
            rows.append(row)
        if not all(c.ok for c in checks):
            return [Check("seed", False, f"{split} {seed}"), *checks], rows
    return checks, rows


def check_function_family(tier: str, family, variants: int) -> tuple[list[Check], list[dict]]:
    """A function family's gates: its contract states every hidden-case class, `variants` hidden
    sets pass the float64 gate and fail every wrong implementation, and its rows come out the same
    twice; with every variant's row at each level."""
    missing = [c.name for c in family.cases if c.phrase not in family.contract]
    checks = [_check("contract", not missing, f"states no phrase of {missing}")]
    try:
        draws = [functions.gated_draw(family, f"verify#{key}", functions.DEFAULT_HIDDEN_CASES) for key in range(variants)]
        checks.append(Check("hidden", True))
    except Exception as e:
        return [*checks, Check("hidden", False, _one_line(e))], []
    if efficiency.LEVEL in family.levels:
        found = [problem for cases in draws for problem in efficiency.problems(family, cases)]
        checks.append(_check("efficiency", not found, f"its expert implementation's graph: {found[:1]}"))
    rows = [family.instance(tier, seed, level).row() for _, seed in variant_seeds(family, variants)
            for level in family.levels]
    again = [family.instance(tier, seed, level).row() for _, seed in variant_seeds(family, variants)
             for level in family.levels]
    checks.append(_check("reproducible", dumps_rows(rows) == dumps_rows(again), "a second generation differs"))
    return checks, rows


def duplicate_rows(rows: list[dict]) -> list[str]:
    """Ids of rows whose instruction and inputs equal an earlier row's."""
    seen, duplicates = set(), []
    for row in rows:
        key = hashlib.sha256(json.dumps([row["question"], row["info"]["inputs"]], sort_keys=True).encode()).digest()
        if key in seen:
            duplicates.append(row["info"]["task_id"])
        seen.add(key)
    return duplicates


def verify(tasks: list[Task], variants: int = 0) -> bool:
    start = time.perf_counter()
    failed, rows = 0, []
    width = max(len(f.id) for members in TIERS.values() for f in members) + len("intermediate ")
    for task in tasks:
        checks = check_task(task)
        ok = all(c.ok for c in checks)
        failed += not ok
        rows += [canonical_instance(task).row()] if ok else []
        print(f"{'ok  ' if ok else 'FAIL'} {task.id:<{width}}  {_describe(checks)}", flush=True)
    family_failed = 0
    catalogues = ((TIERS, check_family), (FUNCTION_TIERS, check_function_family)) if variants else ()
    for catalogue, check in catalogues:
        for tier, family in [(tier, family) for tier, members in catalogue.items() for family in members]:
            checks, family_rows = check(tier, family, variants)
            ok = all(c.ok for c in checks)
            family_failed += not ok
            rows += family_rows
            print(f"{'ok  ' if ok else 'FAIL'} {tier + ' ' + family.id:<{width}}  {_describe(checks)}", flush=True)
    duplicates = duplicate_rows(rows)
    summary = f"{len(tasks)} tasks: {len(tasks) - failed} passed, {failed} failed"
    if variants:
        count = sum(len(m) for m in TIERS.values()) + sum(len(m) for m in FUNCTION_TIERS.values())
        summary += f"; {count} families x {variants} variants: {count - family_failed} passed, {family_failed} failed"
    print(f"{summary}; {len(duplicates)} duplicate rows{' ' + str(duplicates[:5]) if duplicates else ''} "
          f"({time.perf_counter() - start:.1f} s)")
    manifest_ok = verify_manifest()
    return failed == family_failed == len(duplicates) == 0 and manifest_ok


def verify_manifest() -> bool:
    """The default sets against the committed split manifest: one line per changed row."""
    start = time.perf_counter()
    changed = splits.check()
    for line in changed:
        print(f"FAIL manifest {line}")
    rows = sum(len(rows) for rows in splits.load().values()) if splits.MANIFEST.exists() else 0
    print(f"{'ok  ' if not changed else 'FAIL'} split manifest {splits.MANIFEST.name} (version {splits.split_version(splits.MANIFEST)}, "
          f"{rows} rows): {len(changed)} differences ({time.perf_counter() - start:.1f} s)"
          + ("; if the change is meant, run --manifest and say so in CHANGELOG.md" if changed else ""))
    return not changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", metavar="PATH", help="write the dataset as JSONL")
    mode.add_argument("--verify", action="store_true", help="check every task and exit non-zero on any failure")
    mode.add_argument("--manifest", action="store_true",
                      help=f"rewrite the split manifest ({splits.MANIFEST.name}) from a fresh generation of the default sets")
    parser.add_argument("--variants", type=int, default=0, metavar="N",
                        help="with --verify, also check N seeded instances of every family (default 0)")
    args = parser.parse_args(argv)
    if args.variants < 0:
        parser.error(f"--variants must be 0 or more, got {args.variants}")
    if args.verify:
        return 0 if verify(TASKS, args.variants) else 1
    if args.manifest:
        before = splits.load() if splits.MANIFEST.exists() else {}
        manifest = splits.write()
        splits.split_version.cache_clear()
        for line in splits.differences(before, manifest):
            print(line)
        print(f"wrote {sum(len(r) for r in manifest.values())} rows of {len(manifest)} sets to {splits.MANIFEST} "
              f"(split version {splits.split_version()})")
        return 0
    write_rows(TASKS, args.out)
    print(f"wrote {len(TASKS)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
