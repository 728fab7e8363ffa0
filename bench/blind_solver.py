"""A blind solver's run over the held-out test split: it sees each prompt and may run code on the
task's inputs in a sandbox, but never the reference, the expected output or a grade; it leaves one
final answer per task. Grading happens afterwards, with the environment's own sandbox and grader.

    .venv/bin/python bench/blind_solver.py prompts DIR --per-tier 20   # DIR/prompts/<key>.md
    .venv/bin/python bench/blind_solver.py prompts DIR --kind function --level 2 --per-tier 10
    .venv/bin/python bench/blind_solver.py prompts DIR --kind function --level 2 --families ID... --per-family 2
    .venv/bin/python bench/blind_solver.py prompts DIR --kind function --level 3 --families ID... --per-family 2
    .venv/bin/python bench/blind_solver.py try DIR KEY CODE.py          # run code on KEY's inputs (4 times at most)
    .venv/bin/python bench/blind_solver.py grade DIR                    # DIR/answers/<key>.py

For a function task the answer file is the function's source (the final message's code block),
graded on hidden cases drawn from a fresh secret, as the environment does.
"""

import argparse
import asyncio
import json
import secrets
import sys
from collections import defaultdict
from pathlib import Path

from prime_sandboxes import CreateSandboxRequest

from ptenv.host import requests
from ptenv.host.assess import assess_function, assess_result
from ptenv.tasks.rows import parse_row
from ptenv.env.prompt import FUNCTION_SYSTEM_PROMPT, SYSTEM_PROMPT
from ptenv.host.local import LocalSandboxClient
from ptenv.tasks import efficiency
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, HiddenCases
from ptenv.tasks.tiers import FUNCTION_TIERS, TIERS, find_family, instance_seed, select

REQUEST = CreateSandboxRequest(name="blind-solver", docker_image="local")
TIMEOUT = 30  # the environment's cell limit (transports.CELL_TIMEOUT)
TRIES = 4  # runs on a task's inputs before the final answer: the environment's 5 turns in all


def sample(per_tier: int, seed: int, kind: str, level: int) -> dict[str, dict]:
    """key -> {tier, task_id, row}: the first `per_tier` test instances of every tier."""
    tasks = {}
    for tier in [t for t in TIERS if kind == "result" or FUNCTION_TIERS[t]]:
        for k, instance in enumerate(select([tier], "test", per_tier, seed, kind, level)):
            tasks[f"{tier}-{k:03d}"] = {"tier": tier, "task_id": instance.id, "row": instance.row()}
    return tasks


def sample_families(family_ids: list[str], per_family: int, seed: int, level: int) -> dict[str, dict]:
    """key -> {tier, task_id, row}: `per_family` test instances of each function family named."""
    tasks = {}
    for family_id in family_ids:
        tier, family = find_family(family_id)
        for k in range(per_family):
            instance = family.instance(tier, instance_seed(seed, k, "test"), level)
            tasks[f"{tier}-{family.name}-{k}"] = {"tier": tier, "task_id": instance.id, "row": instance.row()}
    return tasks


def write_prompts(out: Path, tasks: dict[str, dict], kind: str) -> None:
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    (out / "answers").mkdir(exist_ok=True)
    key_file(out).write_text(json.dumps(tasks))  # the rows hold the answer key: kept out of the solver's folder
    (out / "SYSTEM.md").write_text((SYSTEM_PROMPT if kind == "result" else FUNCTION_SYSTEM_PROMPT) + "\n")
    for key, task in tasks.items():
        (out / "prompts" / f"{key}.md").write_text(task["row"]["question"] + "\n")
    print(f"{len(tasks)} prompts in {out / 'prompts'}")


def key_file(out: Path) -> Path:
    return out.with_name(out.name + ".key.json")


def load(out: Path) -> dict[str, dict]:
    return json.loads(key_file(out).read_text())


async def run(task: dict, code: str, grade: bool):
    """The cell's reply text, and the verdict when `grade`."""
    row = parse_row(task["row"], task["task_id"])
    client = LocalSandboxClient()
    try:
        sandbox = await client.create(REQUEST)
        await requests.preload(client.call, sandbox.id, row.inputs, timeout=TIMEOUT, limits=client.limits)
        if row.kind == "function" and grade:
            family = find_family(row.family)[1]
            cases = HiddenCases(secrets.token_hex(16), DEFAULT_HIDDEN_CASES).of(family, row.seed)
            budgets = efficiency.budgets(family, cases) if row.level == efficiency.LEVEL else None
            outcome = await assess_function(client.call, sandbox.id, source=code, name=row.function, inputs=row.inputs,
                                            cases=cases, allowlist=family.allowlist(row.level), limits=client.limits,
                                            partial_credit=False, budgets=budgets)
            return "", outcome
        reply = await requests.run_cell(client.call, sandbox.id, code, timeout=TIMEOUT, limits=client.limits)
        outcome = await assess_result(client.call, sandbox.id, expected=row.expected, timeout=TIMEOUT) if grade else None
    finally:
        client.teardown()
    return reply, outcome


def try_code(out: Path, key: str, code_file: Path) -> None:
    """Run code on a task's inputs, at most TRIES times per task: with the final answer, the
    environment's max_turns (5) tool calls."""
    tasks, counts_file = load(out), out.with_name(out.name + ".tries.json")
    counts = json.loads(counts_file.read_text()) if counts_file.exists() else {}
    if key not in tasks:
        sys.exit(f"no task {key!r}")
    if counts.get(key, 0) >= TRIES:
        sys.exit(f"{key}: all {TRIES} tries are used; write the final answer")
    counts[key] = counts.get(key, 0) + 1
    counts_file.write_text(json.dumps(counts))
    reply, _ = asyncio.run(run(tasks[key], code_file.read_text(), grade=False))
    print(reply if reply.strip() else "(the cell printed nothing: only what the code prints is shown)")
    print(f"[{TRIES - counts[key]} tries left for {key}]")


def grade_all(out: Path) -> None:
    tasks = load(out)
    scores, failures = defaultdict(list), []
    for key, task in tasks.items():
        answer = out / "answers" / f"{key}.py"
        if not answer.exists():
            scores[task["tier"]].append(0.0)
            failures.append((key, task["task_id"], "no answer"))
            continue
        _, outcome = asyncio.run(run(task, answer.read_text(), grade=True))
        scores[task["tier"]].append(outcome.verdict.score)
        if outcome.verdict.score != 1.0:
            failures.append((key, task["task_id"], outcome.scoring_error or outcome.verdict.reason))
    for tier, values in scores.items():
        print(f"{tier:<13} mean reward {sum(values) / len(values):6.1%}  ({sum(values):g}/{len(values)})")
    for key, task_id, reason in failures:
        print(f"  failed {key} {task_id}: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("out", type=Path)
    p.add_argument("--per-tier", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", default="result", choices=["result", "function"])
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--families", nargs="+", help="function family ids: their test instances instead of every tier's")
    p.add_argument("--per-family", type=int, default=1)
    t = sub.add_parser("try")
    t.add_argument("out", type=Path)
    t.add_argument("key")
    t.add_argument("code", type=Path)
    g = sub.add_parser("grade")
    g.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "prompts":
        tasks = sample_families(args.families, args.per_family, args.seed, args.level) if args.families \
            else sample(args.per_tier, args.seed, args.kind, args.level)
        write_prompts(args.out, tasks, "function" if args.families else args.kind)
    elif args.command == "try":
        try_code(args.out, args.key, args.code)
    else:
        grade_all(args.out)


if __name__ == "__main__":
    sys.exit(main())
