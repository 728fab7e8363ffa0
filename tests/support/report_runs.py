"""Real vf-eval runs for the report tests, on either verifiers line, and what their report must say
computed here without ptenv.report.

The `mixed` policy gives each prompt of a run one behaviour, so a run of 8 prompts shows every
failure reason. Behaviours go to prompts in the order the server first sees them (vf-eval runs
prompts concurrently), so which task gets which behaviour varies, but the totals of a run do not.
"""

import contextlib
import io
import json
import os
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support import policy_server
from ptenv.report.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
VF_EVAL_TIMEOUT = 280

# The reason each behaviour's rollouts fail for, or "pass"; "coin" passes one rollout per prompt.
BEHAVIOURS = {
    "coin": None,
    "reference": "pass",
    "null": "no result",
    "shape": "shape",
    "dtype": "dtype",
    "values": "values",
    "invalid": "invalid answer",
    "harness": "harness error",
}
EDITS = {
    "shape": "result = result.unsqueeze(0)",
    "dtype": "result = result.to(torch.int64 if result.is_floating_point() else torch.float64)",
    "values": "result = torch.zeros_like(result)",  # every task is gated against zeros_like
}


def mixed_policy():
    """A fresh policy: behaviour i % 8 for the i-th prompt it sees; a list of the calls it played."""
    lock, behaviour_of, rollouts_of = threading.Lock(), {}, {}

    def policy(row, messages, tools):
        key = row["info"]["task_id"]
        first_turn = not any(m.get("role") == "assistant" for m in messages)
        with lock:
            behaviour = behaviour_of.setdefault(key, list(BEHAVIOURS)[len(behaviour_of) % len(BEHAVIOURS)])
            if first_turn:
                rollouts_of[key] = rollouts_of.get(key, 0) + 1
            rollout = rollouts_of[key]
        if not first_turn:
            return {"role": "assistant", "content": "done"}
        if behaviour == "harness":
            # The endpoint refuses the request (422, which clients do not retry): the rollout fails.
            raise policy_server.RequestError(422, "scripted model failure", "scripted_failure")
        if behaviour == "null" or (behaviour == "coin" and rollout > 1):
            return {"role": "assistant", "content": "I will not attempt this task."}
        code = row["info"]["reference_solution"]
        if behaviour == "invalid":
            code = "result = 'not a tensor'"
        elif behaviour in EDITS:
            code += "\n" + EDITS[behaviour]
        return call("execute_code", code=code)

    return policy


def call(name: str, **arguments) -> dict:
    tool_call = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [tool_call]}


def expected_reasons(prompts: int, rollouts: int) -> dict[str, int]:
    """The failure-reason totals (with "pass") of a mixed run of `prompts` prompts x `rollouts`."""
    totals = {}
    for i in range(prompts):
        behaviour = list(BEHAVIOURS)[i % len(BEHAVIOURS)]
        if behaviour == "coin":
            totals["pass"] = totals.get("pass", 0) + 1
            totals["no result"] = totals.get("no result", 0) + rollouts - 1
        else:
            reason = BEHAVIOURS[behaviour]
            totals[reason] = totals.get(reason, 0) + rollouts
    return totals



def classic_eval(vf_eval: Path, url: str, policy: str, out: Path, *args: str) -> Path:
    """`vf-eval` of verifiers 0.3.1, saving results; returns the results.jsonl."""
    command = [str(vf_eval), "pytorch-env", "-m", policy, "-b", url, "-k", "REPORT_TEST_KEY", *args, "-s", "-d",
               "-o", str(out)]
    _run(command, {"REPORT_TEST_KEY": "unused"})
    (results,) = out.glob("evals/*/*/results.jsonl")
    return results


def v1_eval(vf_eval: Path, url: str, policy: str, out: Path, *args: str) -> Path:
    """`vf-eval` of verifiers 0.4; returns the traces.jsonl."""
    command = [str(vf_eval), "pytorch-env", "-m", policy, "--client.base-url", url, *args, "--no-push", "--no-rich",
               "-o", str(out), "--run.dir", "run"]
    _run(command, {"PATH": f"{vf_eval.parent}:{os.environ['PATH']}"})  # its harness program needs `uv`
    return out / "run" / "traces.jsonl"


def _run(command: list[str], env: dict) -> None:
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=VF_EVAL_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]


def synthetic_run(out: Path, rewards: dict[str, list[float]], line: str = "classic", model: str = "synthetic") -> Path:
    """A run written as vf-eval of either line would, without vf-eval: task id "category/name" ->
    its rollouts' rewards (tier basic; a reward below 1.0 failed on values). Returns its results file."""
    def info(reward: float) -> dict:
        verdict = {"score": reward, "kind": "pass" if reward == 1.0 else "values"}
        return {"verdict": verdict, "scoring_error": None, "versions": {"pytorch-env": "0.3.0"}}

    tasks = [(task, {"category": task.split("/")[0], "tier": "basic"}) for task in rewards]
    out.mkdir(parents=True)
    if line == "classic":
        (out / "metadata.json").write_text(json.dumps({"env_id": "pytorch-env", "model": model,
                                                       "num_examples": len(rewards)}))
        rows = [{"example_id": i, "reward": x, "metrics": {}, "info": {"task_id": task, **meta, **info(x)}}
                for i, (task, meta) in enumerate(tasks) for x in rewards[task]]
        results = out / "results.jsonl"
    else:
        (out / "configs" / "resolved").mkdir(parents=True)
        (out / "configs" / "resolved" / "eval.json").write_text(json.dumps({"model": model}))
        rows = [{"env": {"id": "pytorch-env"}, "traces": [
            {"task": {"data": {"id": task, "info": meta}}, "ok": True, "metrics": {}, "info": info(x),
             "rewards": {"correctness": {"score": x}}} for x in rewards[task]]} for task, meta in tasks]
        results = out / "traces.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return results


def outcomes(results: Path) -> list[dict]:
    """Each rollout's task, category, reward and harness error, read straight from either line's file."""
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    if results.name == "results.jsonl":
        return [{"task": r["info"]["task_id"], "category": r["info"]["category"], "reward": r["reward"],
                 "harness": r["info"]["scoring_error"] is not None} for r in rows]
    traces = [t for episode in rows for t in episode["traces"]]
    return [{"task": t["task"]["data"]["id"], "category": t["task"]["data"]["info"]["category"],
             "reward": (t["rewards"].get("correctness") or {}).get("score", 0.0),
             "harness": t["info"]["scoring_error"] is not None} for t in traces]


def expected_rows(rollouts: list[dict]) -> dict[str, dict]:
    """Per category (tier "basic") and "all": the report's numbers for a run of 2 rollouts per prompt.

    With n = k = 2, pass@2 is the share of prompts with any rollout right: no estimator needed."""
    table = {}
    for name in sorted({r["category"] for r in rollouts}) + ["all"]:
        rs = [r for r in rollouts if name in ("all", r["category"])]
        prompts = {}
        for r in rs:
            prompts.setdefault(r["task"], []).append(r["reward"])
        assert all(len(v) == 2 for v in prompts.values())
        table[name] = {
            "rollouts": len(rs),
            "pass@1": sum(v.count(1.0) / 2 for v in prompts.values()) / len(prompts),
            "pass@2": sum(1.0 in v for v in prompts.values()) / len(prompts),
            "mean reward": sum(r["reward"] for r in rs) / len(rs),
            "harness errors": sum(r["harness"] for r in rs),
            "all same": sum(len(set(v)) == 1 for v in prompts.values()) / len(prompts),
        }
    return table


def markdown_tables(text: str) -> dict[str, list[dict]]:
    """The Markdown file's tables by their heading, each a list of {column: cell}."""
    tables, heading, rows = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif line.startswith("|") and heading:
            if not set(line) <= set("|:- "):  # not the alignment row
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            tables[heading], rows = [dict(zip(rows[0], row)) for row in rows[1:]], []
    if rows:
        tables[heading] = [dict(zip(rows[0], row)) for row in rows[1:]]
    return tables


def value_of(cell: str) -> str:
    """A report cell's value without its interval and mark ("0.500 [0.250, 0.750]*" -> "0.500")."""
    return cell.split(" [")[0]


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature and chunk type."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR", "the first chunk is not IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def report(*args) -> Done:
    """`python -m ptenv.report ARGS`, its main called in this process (saves a torch import per call)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's own errors
            code = e.code
    return Done(code, out.getvalue(), err.getvalue())
