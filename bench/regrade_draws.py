"""What drawing hidden cases per rollout costs a GRPO group's signal, against one shared set per
prompt (issue 35): saved function-task answers, re-graded both ways in real sandboxes.

    .venv/bin/python bench/regrade_draws.py [--repeats 3] [RESULTS.jsonl ...]

Default input: the Qwen2.5-Coder-1.5B function runs under bench/results/ (each prompt's 3 rollouts,
their final messages as the model wrote them). Each answer is graded on (a) the prompt's shared set
(a draw of a fresh secret, the same for all its rollouts, as before issue 35) and (b) a set of its
own (that secret and a nonce per rollout), `--repeats` times each with a new secret. Printed per
run: the mean reward (partial credit: the fraction of hidden cases passed; and binary: all passed),
the mean within-group variance of the reward, and the share of groups whose rollouts all scored alike.
"""

import argparse
import asyncio
import json
import secrets
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from ptenv.host.answer import final_message, function_source  # noqa: E402
from ptenv.host.assess import assess_function  # noqa: E402
from ptenv.host.local import LocalSandboxClient  # noqa: E402
from ptenv.tasks.functions import DEFAULT_HIDDEN_CASES, HiddenCases  # noqa: E402
from ptenv.tasks.tiers import find_family  # noqa: E402

RUNS = sorted((REPO / "bench" / "results").glob("qwen2.5-coder-1.5b-function-*/*/evals/*/*/results.jsonl"))


async def grade(client, row: dict, cases: list) -> float:
    """The answer's fraction of hidden cases passed, in a fresh sandbox."""
    info = row["info"]
    family = find_family(info["family"])[1]
    source = function_source(final_message(row["completion"]), info["function"])
    sandbox = await client.create(REQUEST)
    try:
        outcome = await assess_function(client.call, sandbox.id, source=source, name=info["function"],
                                        inputs=family.instance(info["tier"], info["seed"], info["level"]).inputs(),
                                        cases=cases, allowlist=family.allowlist(info["level"]), limits=client.limits,
                                        partial_credit=True)
    finally:
        await client.delete(sandbox.id)
    if outcome.scoring_error:
        sys.exit(f"{row['info']['task_id']}: {outcome.scoring_error}")
    return outcome.verdict.score


def summary(groups: list[list[float]]) -> dict:
    binary = [[float(r == 1.0) for r in g] for g in groups]
    return {
        "mean": statistics.mean(r for g in groups for r in g),
        "pass": statistics.mean(r for g in binary for r in g),
        "variance": statistics.mean(statistics.pvariance(g) for g in groups),
        "variance_binary": statistics.mean(statistics.pvariance(g) for g in binary),
        "all_same": statistics.mean(len(set(g)) == 1 for g in groups),
        "all_same_binary": statistics.mean(len(set(g)) == 1 for g in binary),
    }


async def regrade(path: Path, repeats: int, client) -> dict[str, list[dict]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_prompt = defaultdict(list)
    for row in rows:
        by_prompt[row["info"]["task_id"]].append(row)
    out = {"shared": [], "per rollout": []}
    for _ in range(repeats):
        cases = HiddenCases(secrets.token_hex(16), DEFAULT_HIDDEN_CASES)
        shared, own = [], []
        for group in by_prompt.values():
            family = find_family(group[0]["info"]["family"])[1]
            seed = group[0]["info"]["seed"]
            one_set = cases.of(family, seed)
            shared.append([await grade(client, row, one_set) for row in group])
            own.append([await grade(client, row, cases.of(family, seed, secrets.token_hex(8))) for row in group])
        out["shared"].append(summary(shared))
        out["per rollout"].append(summary(own))
    return out


async def main(paths: list[Path], repeats: int) -> None:
    client = LocalSandboxClient()
    try:
        for path in paths:
            results = await regrade(path, repeats, client)
            print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path} ({repeats} secrets)")
            print(f"  {'cases':<12}{'reward':>8}{'pass':>8}{'var':>8}{'var 0/1':>9}{'all-same':>10}{'all-same 0/1':>14}")
            for way, runs in results.items():
                m = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
                print(f"  {way:<12}{m['mean']:8.3f}{m['pass']:8.3f}{m['variance']:8.4f}{m['variance_binary']:9.4f}"
                      f"{m['all_same']:10.1%}{m['all_same_binary']:14.1%}", flush=True)
    finally:
        client.teardown()


if __name__ == "__main__":
    from prime_sandboxes import CreateSandboxRequest

    REQUEST = CreateSandboxRequest(name="regrade", docker_image="local")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=RUNS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.paths, args.repeats))
