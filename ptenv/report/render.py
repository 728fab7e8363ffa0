"""A report as text, Markdown and CSV: one run, or two side by side. Tables are built once from
raw values; text and Markdown show floats to 3 places, an estimate as "value [low, high]" (a delta
whose interval excludes 0 marked *), CSV floats to 6 significant digits with an estimate's interval
in its own "low" and "high" columns."""

import csv
import io

from ptenv.report.reasons import REASONS
from ptenv.report.runs import Run
from ptenv.report.bootstrap import NAME, RESAMPLES
from ptenv.report.stats import Delta, Estimate, Stats, compare, order

OUTCOMES = ("pass", *REASONS)
INTERVALS = (f"intervals: [low, high] is a {NAME} ({RESAMPLES} resamples, seeded), each prompt's rollouts kept "
             "together; none for a group of one prompt")
DELTAS = ("deltas: B - A, * where its interval excludes 0; paired (one draw of the prompts for both runs) where "
          "both runs have the same prompts, else each run's prompts drawn on their own")
KEYS = ("category", "tier", "task")


def results_table(stats: list[Stats], width: int) -> tuple[list, list]:
    """Rows keyed by the first `width` of category, tier, task (a group row has no task)."""
    k = max(len(s.pass_at) for s in stats)
    headers = [*KEYS[:width], "rollouts", *(f"pass@{i}" for i in range(1, k + 1)),
               "mean reward", "harness errors", "all same"]
    rows = [[*_key(s, width), s.rollouts, *s.pass_at, *[None] * (k - len(s.pass_at)), s.mean_reward,
             s.harness_errors, s.all_same] for s in stats]
    return headers, rows


def reasons_table(stats: list[Stats], width: int) -> tuple[list, list]:
    return [*KEYS[:width], *OUTCOMES], [[*_key(s, width), *(s.reasons[o] for o in OUTCOMES)] for s in stats]


def compare_table(a: list[Stats], b: list[Stats]) -> tuple[list, list]:
    """Per category and tier: rollouts, pass@1 and mean reward of A and B with B - A, whether the
    deltas' intervals are paired, harness errors. A row only one run has gets no deltas."""
    by_key_a, by_key_b = {s.key: s for s in a}, {s.key: s for s in b}
    keys = sorted(by_key_a.keys() | by_key_b.keys(), key=lambda key: (key[0] == "all", order(key)))
    headers = ["category", "tier", "rollouts A", "rollouts B", "pass@1 A", "pass@1 B", "pass@1 delta",
               "mean reward A", "mean reward B", "mean reward delta", "paired", "harness errors A",
               "harness errors B"]
    rows = []
    for key in keys:
        sa, sb = by_key_a.get(key), by_key_b.get(key)
        paired, pass_delta, mean_delta = compare(sa, sb) if sa and sb else (None, None, None)
        rows.append([*key, sa and sa.rollouts, sb and sb.rollouts, sa and sa.pass_at[0], sb and sb.pass_at[0],
                     pass_delta, sa and sa.mean_reward, sb and sb.mean_reward, mean_delta,
                     None if paired is None else "yes" if paired else "no", sa and sa.harness_errors,
                     sb and sb.harness_errors])
    return headers, rows


def report_text(run: Run, groups: list[Stats], tasks: list[Stats] | None) -> str:
    parts = ["\n".join(run_lines(run))]
    for title, stats, width in (("", groups, 2), (" per task", tasks, 3)):
        if stats:
            parts += [_text(results_table(stats, width), title.strip()),
                      _text(reasons_table(stats, width), f"failure reasons{title} (rollouts)")]
    return "\n\n".join(parts) + "\n"


def report_markdown(run: Run, groups: list[Stats], tasks: list[Stats] | None) -> str:
    parts = ["# pytorch-env report", "\n".join(f"- {line}" for line in run_lines(run))]
    for title, stats, width in (("", groups, 2), (" per task", tasks, 3)):
        if stats:
            parts += [f"## Results{title}", _markdown(results_table(stats, width)),
                      f"## Failure reasons{title} (rollouts)", _markdown(reasons_table(stats, width))]
    return "\n\n".join(parts) + "\n"


def report_csv(groups: list[Stats], tasks: list[Stats] | None) -> str:
    """One row per category and tier, the whole run, then one per task: task empty on the first two."""
    stats = [*groups, *(tasks or [])[:-1]]  # the per-task list ends with the whole run again
    headers, rows = results_table(stats, 3)
    reason_headers, reason_rows = reasons_table(stats, 3)
    return _csv((headers + reason_headers[3:], [row + more[3:] for row, more in zip(rows, reason_rows)]))


def compare_text(a: Run, b: Run, table) -> str:
    return "\n\n".join(["\n".join(compare_lines(a, b)), _text(table, "")]) + "\n"


def compare_markdown(a: Run, b: Run, table) -> str:
    lines = "\n".join(f"- {line}" for line in compare_lines(a, b))
    heading = "## pass@1 and mean reward per category and tier"
    return "\n\n".join(["# pytorch-env comparison", lines, heading, _markdown(table)]) + "\n"


def compare_csv(table) -> str:
    return _csv(table)


def run_lines(run: Run) -> list[str]:
    prompts = len({r.task_id for r in run.rollouts})
    lines = [f"run: {run.path}",
             f"verifiers line: {run.line}, model: {run.model}, {prompts} prompts, {len(run.rollouts)} rollouts",
             f"versions: {versions_text(run)}", INTERVALS]
    if run.guessed:
        lines.append(f"note: no verdict recorded, so {run.guessed} failed rollouts with neither shape nor dtype "
                     "right count as invalid answers (runs of this version record the verdict, which tells them apart)")
    return lines


def compare_lines(a: Run, b: Run) -> list[str]:
    lines = [f"{name}: {run.path} ({run.line}, model {run.model}, {len(run.rollouts)} rollouts; "
             f"versions: {versions_text(run)})" for name, run in (("A", a), ("B", b))]
    if a.versions != b.versions:
        lines.append(f"versions differ: {versions_diff(a, b)}")
    return lines + [INTERVALS, DELTAS]


def versions_diff(a: Run, b: Run) -> str:
    """What differs: each component whose version differs, when each run has one stamp."""
    if len(a.versions) != 1 or len(b.versions) != 1:
        return f"{versions_text(a)} (A) vs {versions_text(b)} (B)"
    stamp_a, stamp_b = dict(a.versions[0]), dict(b.versions[0])
    return "; ".join(f"{name} {stamp_a.get(name, 'not recorded')} (A) vs {stamp_b.get(name, 'not recorded')} (B)"
                     for name in sorted(stamp_a.keys() | stamp_b.keys()) if stamp_a.get(name) != stamp_b.get(name))


def versions_text(run: Run) -> str:
    stamps = [", ".join(f"{name} {version}" for name, version in stamp) or "not recorded" for stamp in run.versions]
    return stamps[0] if len(stamps) == 1 else "MIXED within the run: " + " | ".join(stamps)


def _key(s: Stats, width: int) -> tuple:
    return (*s.key, "", "")[:width]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, Estimate):
        if value.interval is None:
            return f"{value.value:.3f}"
        mark = "*" if isinstance(value, Delta) and value.excludes_zero else ""
        return f"{value.value:.3f} [{value.interval[0]:.3f}, {value.interval[1]:.3f}]{mark}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _text(table, title: str) -> str:
    headers, rows = table
    cells = [headers] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    keys = sum(h in KEYS for h in headers)  # left-aligned; numbers right-aligned
    lines = ["  ".join(c.ljust(w) if i < keys else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in cells]
    return "\n".join(([title] if title else []) + lines)


def _markdown(table) -> str:
    headers, rows = table
    keys = sum(h in KEYS for h in headers)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(":---" if i < keys else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _csv(table) -> str:
    """A column of estimates becomes three: its values, then "low" and "high" (empty without an interval)."""
    headers, rows = table
    wide = [any(isinstance(row[i], Estimate) for row in rows) for i in range(len(headers))]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([name for h, w in zip(headers, wide) for name in ([h, f"{h} low", f"{h} high"] if w else [h])])
    for row in rows:
        cells = [part for v, w in zip(row, wide) for part in (_spread(v) if w else [v])]
        writer.writerow(["" if v is None else f"{v:.6g}" if isinstance(v, float) else v for v in cells])
    return out.getvalue()


def _spread(value) -> list:
    """An estimate's value, low and high (None for what is missing)."""
    if value is None:
        return [None, None, None]
    return [value.value, *(value.interval or (None, None))]
