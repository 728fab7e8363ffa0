"""Read a vf-eval run of pytorch-env, from either verifiers line, into one Rollout per rollout.

classic (0.3.1) `vf-eval -s` writes `results.jsonl` (one rollout a line) beside `metadata.json`;
verifiers 0.4 writes `traces.jsonl` (one episode a line, its rollouts in `traces`) beside
`configs/resolved/eval.json`. Anything else, or a file cut short, is a RunError with one line.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ptenv.report.reasons import classify
from ptenv.inside.protocol import one_line

ENV_ID = "pytorch-env"
RESULT_FILES = ("results.jsonl", "traces.jsonl")
DEFAULT_TIER = "basic"  # runs made before tiers existed


class RunError(ValueError):
    """The input is not a readable pytorch-env run; the message is one line saying why."""


@dataclass(frozen=True)
class Rollout:
    task_id: str
    category: str
    tier: str
    reward: float  # a rollout that failed unscored (v1) counts 0.0
    reason: str  # "pass" or a failure reason (ptenv.report.reasons)
    versions: tuple  # sorted (name, version) pairs; () when not recorded


@dataclass(frozen=True)
class Run:
    path: Path  # the results file
    line: str  # "classic" or "v1"
    model: str
    rollouts: list[Rollout]
    guessed: int  # failures whose reason was told from metrics alone (no recorded verdict)

    @property
    def versions(self) -> list[tuple]:
        """The distinct version stamps of the run's rollouts (one, unless the run mixed installs)."""
        return sorted({r.versions for r in self.rollouts})


def find_results(path: Path) -> Path:
    """The results file of a run: PATH itself, or the one results file in or under the directory PATH."""
    if path.is_file():
        if path.name not in RESULT_FILES:
            raise RunError(f"{path}: not a vf-eval output (expected {' or '.join(RESULT_FILES)})")
        return path
    if not path.is_dir():
        raise RunError(f"{path}: no such file or directory")
    found = sorted(p for name in RESULT_FILES for p in path.rglob(name))
    if not found:
        raise RunError(f"{path}: not a vf-eval output (no {' or '.join(RESULT_FILES)} in or under it)")
    if len(found) > 1:
        listed = ", ".join(str(p.relative_to(path)) for p in found[:3])
        raise RunError(f"{path}: holds {len(found)} runs ({listed}{', ...' if len(found) > 3 else ''}): name one")
    return found[0]


def load_run(path: Path) -> Run:
    results = find_results(Path(path))
    read = _read_classic if results.name == "results.jsonl" else _read_v1
    line, model, (prompts, per_prompt), records = read(results)
    if not records:
        raise RunError(f"{results}: no rollouts")
    rollouts, guessed = [], 0
    for where, task, record in records:
        try:
            reason, was_guessed = classify(record)
        except ValueError as e:
            raise RunError(f"{where}: not a {ENV_ID} rollout: {e}") from None
        guessed += was_guessed
        versions = record["versions"]
        stamp = tuple(sorted(versions.items())) if isinstance(versions, dict) else ()
        rollouts.append(Rollout(task["task_id"], task["category"], tier_label(task), record["reward"], reason, stamp))
    _check_complete(results, rollouts, prompts, per_prompt)
    return Run(results, line, model, rollouts, guessed)


def tier_label(task: dict) -> str:
    """The tier a report groups by; a function task's says its kind and level ("basic-fn1"), so
    that the two kinds of the same tier are never averaged together."""
    tier = task.get("tier", DEFAULT_TIER)
    return f"{tier}-fn{task.get('level')}" if task.get("kind") == "function" else tier


def _lines(path: Path) -> list[tuple[str, object]]:
    """(where, parsed JSON) for each line; a last line cut short says so."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise RunError(f"{path}: {one_line(e)}") from None
    lines = text.split(b"\n")
    parsed = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            parsed.append((where, json.loads(raw)))
        except ValueError:
            cut = number == len(lines) and not text.endswith(b"\n")
            raise RunError(f"{where}: {'truncated: the last line is incomplete' if cut else 'not JSON'}") from None
    return parsed


def _json_file(path: Path) -> dict:
    """A run's metadata file, or {} when there is none (a results file copied out on its own)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise RunError(f"{path}: {one_line(e)}") from None
    if not isinstance(doc, dict):
        raise RunError(f"{path}: not a JSON object")
    return doc


def _read_classic(path: Path):
    metadata = _json_file(path.with_name("metadata.json"))
    _check_env(path, metadata.get("env_id", ENV_ID))
    records = []
    for where, row in _lines(path):
        if not isinstance(row, dict) or "example_id" not in row or "reward" not in row:
            raise RunError(f"{where}: not a verifiers results row (no example_id or reward)")
        info = row.get("info")
        if isinstance(info, str):
            info = _loads(info, where)
        task = _task(info, where)
        # The verdict is in the row's info; runs saved before it was are read from `-C scoring_error,verdict`.
        record = {"reward": _number(row["reward"], where), "metrics": row.get("metrics") or {},
                  "verdict": info.get("verdict", row.get("verdict")),
                  "scoring_error": info.get("scoring_error", row.get("scoring_error")),
                  "versions": info.get("versions")}
        records.append((where, task, record))
    shape = metadata.get("num_examples"), metadata.get("rollouts_per_example")
    return "classic", metadata.get("model", "?"), shape, records


def _read_v1(path: Path):
    config = _json_file(path.parent / "configs" / "resolved" / "eval.json")
    records = []
    for where, episode in _lines(path):
        if not isinstance(episode, dict) or not isinstance(episode.get("traces"), list):
            raise RunError(f"{where}: not a verifiers 0.4 episode (no traces)")
        _check_env(path, (episode.get("env") or {}).get("id"))
        for trace in episode["traces"]:
            data = (trace.get("task") or {}).get("data") or {}
            task = _task({"task_id": data.get("id"), **(data.get("info") or {})}, where)
            info = trace.get("info") or {}
            score = ((trace.get("rewards") or {}).get("correctness") or {}).get("score")
            record = {"reward": 0.0 if score is None else _number(score, where), "metrics": trace.get("metrics") or {},
                      "verdict": info.get("verdict"), "scoring_error": info.get("scoring_error"),
                      "failed": not trace.get("ok", False), "versions": info.get("versions")}
            records.append((where, task, record))
    # How many tasks a selection keeps is not recorded; rollouts per task are.
    return "v1", config.get("model", "?"), (None, config.get("num_rollouts")), records


def _check_env(path: Path, env_id) -> None:
    if env_id != ENV_ID:
        raise RunError(f"{path}: a run of environment {env_id!r}, not {ENV_ID}")


def _task(info, where: str) -> dict:
    if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in ("task_id", "category")):
        raise RunError(f"{where}: not a {ENV_ID} rollout (its info has no task_id and category)")
    return info


def _loads(text: str, where: str):
    try:
        return json.loads(text)
    except ValueError:
        raise RunError(f"{where}: info is not JSON") from None


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunError(f"{where}: reward {value!r} is not a number")
    return float(value)


def _check_complete(path: Path, rollouts: list[Rollout], prompts, per_prompt) -> None:
    """The run's prompts, each with the run's rollouts per prompt: fewer means the file was cut at a line's end."""
    counts = {}
    for r in rollouts:
        counts[r.task_id] = counts.get(r.task_id, 0) + 1
    if prompts and len(counts) < prompts:
        raise RunError(f"{path}: truncated: {len(counts)} of the run's {prompts} prompts are in it")
    short = sorted(task for task, n in counts.items() if per_prompt and n < per_prompt)
    if short:
        raise RunError(f"{path}: truncated: {short[0]} has {counts[short[0]]} of {per_prompt} rollouts"
                       + (f" ({len(short) - 1} more prompts short)" if len(short) > 1 else ""))
