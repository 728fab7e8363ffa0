"""How hard each tier is for one model: the real `vf-eval` per tier, then pass@1 and the share of
prompts whose rollouts all scored the same (a GRPO group that teaches nothing).

    .venv/bin/python bench/difficulty.py -m reference            # scripted policies, served here
    .venv/bin/python bench/difficulty.py -m null
    .venv/bin/python bench/difficulty.py -m MODEL -b http://HOST:PORT/v1 -k API_KEY_VAR [--out DIR] [-- VF-EVAL ARGS]

With --out, a tier that already has a run there is resumed (vf-eval --resume), and -n may grow.

Each tier's held-out test split (its default set unless -n) is evaluated with -r 3 rollouts per
prompt. A scripted policy (reference, null, hostile) is served by tests.support.policy_server from the
very rows the environment generates, so the reference policy knows every row's solution.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.support is not installed

from ptenv.tasks.rows import dumps_rows, row_digest
from tests.support.policy_server import POLICIES, serve_in_thread
from ptenv.tasks.tiers import TIERS, families, parse_families, select

VF_EVAL = Path(sys.executable).with_name("vf-eval")


def tier_rows(tier: str, args) -> list[dict]:
    chosen = parse_families(tier_families(tier, args), [tier], args.split, args.kind, args.level)
    return [instance.row() for instance in select([tier], args.split, args.n, args.seed, args.kind, args.level, chosen)]


def tier_families(tier: str, args) -> list[str] | None:
    """The tier's families among --families (None: all of them)."""
    if args.families is None:
        return None
    ids = [f.id for f in families(tier, args.split, args.kind, args.level)]
    return [f for f in args.families if f in ids]


def run_tier(args, tier: str, url: str, key_var: str, out: Path) -> list[dict]:
    env_args = {"tiers": tier, "split": args.split, "num_train_examples": args.n, "seed": args.seed}
    if args.families is not None:
        env_args["families"] = tier_families(tier, args)
    if args.kind == "function":
        env_args.update(kind="function", level=args.level, partial_credit=args.partial_credit)
    rows = tier_rows(tier, args)
    command = [str(VF_EVAL), "pytorch-env", "-m", args.model, "-b", url, "-k", key_var, "-a", json.dumps(env_args),
               "-n", str(len(rows)), "-r", str(args.r), "-c", str(args.c), "-s", "-C", "scoring_error,verdict",
               "-o", str(out), *args.vf_eval, *resume(out, env_args, rows)]
    print("$", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, key_var: os.environ.get(key_var, "unused")})
    if done.returncode != 0:
        sys.exit(f"vf-eval exited with {done.returncode}:\n{done.stdout[-3000:]}")
    (results,) = out.glob("evals/*/*/results.jsonl")
    return [json.loads(line) for line in results.read_text().splitlines()]


def resume(out: Path, env_args: dict, rows: list[dict]) -> list[str]:
    """vf-eval's --resume for an earlier run of this tier in `out`, so a long measurement can stop
    and go on. A smaller -n is a prefix of a larger one (select is round-robin), so it may grow."""
    runs = list(out.glob("evals/*/*/metadata.json"))
    if not runs:
        return []
    if len(runs) > 1:
        sys.exit(f"{out}: {len(runs)} runs, cannot tell which to resume")
    saved = json.loads(runs[0].read_text())["env_args"]
    before, now = saved["num_train_examples"], env_args["num_train_examples"]
    grows = 0 <= before <= now or before == now
    if {**saved, "num_train_examples": now} != env_args or not grows:
        sys.exit(f"{runs[0].parent}: run with {saved}, cannot resume it as {env_args}")
    drop_stale(runs[0].with_name("results.jsonl"), rows)
    return ["--resume", str(runs[0].parent)]


def drop_stale(results: Path, rows: list[dict]) -> None:
    """Drop the saved rollouts of rows that changed since (a task fixed between sessions): vf-eval
    resumes by row index, so it would count them as done against the new row."""
    digests = [row_digest(row) for row in rows]
    lines = results.read_text().splitlines(keepends=True)

    def current(line: str) -> bool:
        saved = json.loads(line)
        return saved["info"].get("row") == digests[int(saved["example_id"])]

    kept = [line for line in lines if current(line)]
    if len(kept) < len(lines):
        print(f"{results}: dropped {len(lines) - len(kept)} rollouts of rows that changed since", flush=True)
        results.write_text("".join(kept))


def outcome(verdict: dict) -> str | None:
    return verdict.get("outcome", verdict.get("kind"))  # runs saved before 0.5.0 call it `kind`


def summarise(rollouts: list[dict]) -> dict:
    by_prompt = defaultdict(list)
    for r in rollouts:
        by_prompt[r["info"]["task_id"]].append(r["reward"])
    return {
        "prompts": len(by_prompt),
        "rollouts": len(rollouts),
        "pass@1": sum(r["reward"] for r in rollouts) / len(rollouts),
        "all_pass": sum(outcome(r.get("verdict", {})) == "pass" for r in rollouts) / len(rollouts),
        "all_same": sum(len(set(rewards)) == 1 for rewards in by_prompt.values()) / len(by_prompt),
        "scoring_error": sum(r.get("scoring_error") is not None for r in rollouts),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", required=True, help=f"model name, or a scripted policy: {sorted(POLICIES)}")
    parser.add_argument("-b", "--base-url", help="OpenAI-compatible endpoint (omit for a scripted policy)")
    parser.add_argument("-k", "--api-key-var", default="DIFFICULTY_API_KEY", help="env var holding the API key")
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    parser.add_argument("--families", nargs="+", help="only these family ids (each tier runs those of its own)")
    parser.add_argument("--split", default="test", choices=["train", "test"])
    parser.add_argument("-n", type=int, default=-1, help="prompts per tier (-1: the split's default set)")
    parser.add_argument("-r", type=int, default=3, help="rollouts per prompt")
    parser.add_argument("-c", type=int, default=16, help="concurrent rollouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", default="result", choices=["result", "function"])
    parser.add_argument("--level", type=int, default=1, help="a function task's level")
    parser.add_argument("--partial-credit", action="store_true", help="function tasks: the fraction of hidden cases is the reward")
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    parser.add_argument("--out", type=Path, help="keep each tier's vf-eval output here (for python -m ptenv.report)")
    parser.add_argument("vf_eval", nargs="*", help="more vf-eval arguments, after --: sampling, e.g. -- -t 700 -T 0.7")
    args = parser.parse_args()
    if args.base_url is None and args.model not in POLICIES:
        parser.error(f"--base-url is required unless --model is a scripted policy ({sorted(POLICIES)})")
    if args.families is not None:
        if unknown := set(args.families) - {f for tier in args.tiers for f in tier_families(tier, args)}:
            parser.error(f"not families of the {args.kind} form of tiers {args.tiers} on the {args.split} split: {sorted(unknown)}")
        args.tiers = [tier for tier in args.tiers if tier_families(tier, args)]
    table = {}
    with tempfile.TemporaryDirectory(prefix="difficulty-") as tmp:
        keep = args.out or Path(tmp)
        for tier in args.tiers:
            url, stop = args.base_url, None
            if url is None:
                dataset = Path(tmp) / f"{tier}.jsonl"
                dataset.write_text(dumps_rows(tier_rows(tier, args)))
                url, stop = serve_in_thread(dataset)
            try:
                table[tier] = summarise(run_tier(args, tier, url, args.api_key_var, keep / tier))
            finally:
                if stop:
                    stop()
    kind = f"kind {args.kind}" + (f", level {args.level}, partial credit {args.partial_credit}" if args.kind == "function" else "")
    print(f"\nmodel {args.model}, split {args.split}, -r {args.r}, {kind}")
    print(f"{'tier':<13} {'prompts':>7} {'rollouts':>8} {'reward':>7} {'all-pass':>8} {'all-same':>8} {'scoring_error':>13}")
    for tier, s in table.items():
        print(f"{tier:<13} {s['prompts']:>7} {s['rollouts']:>8} {s['pass@1']:>7.1%} {s['all_pass']:>8.1%} "
              f"{s['all_same']:>8.1%} {s['scoring_error']:>13}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "split": args.split, "r": args.r,
                                               "kind": args.kind, "level": args.level,
                                               "partial_credit": args.partial_credit, "tiers": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
