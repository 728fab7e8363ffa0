"""A report's text and files, built in memory: written only once everything has parsed and rendered."""

from ptenv.report import render
from ptenv.report.plot import plot_png
from ptenv.report.runs import Run
from ptenv.report.stats import Stats, group


def build_report(run: Run, by_task: bool) -> tuple[str, dict[str, bytes]]:
    groups = group(run.rollouts)
    tasks = group(run.rollouts, by_task=True) if by_task else None
    files = {
        "report.md": render.report_markdown(run, groups, tasks).encode(),
        "report.csv": render.report_csv(groups, tasks).encode(),
        "report.png": plot_png(by_tier(groups, ""), f"{run.model} ({run.line}): pass@1 per category"),
    }
    return render.report_text(run, groups, tasks), files


def build_comparison(a: Run, b: Run) -> tuple[str, dict[str, bytes]]:
    groups_a, groups_b = group(a.rollouts), group(b.rollouts)
    table = render.compare_table(groups_a, groups_b)
    series = {**by_tier(groups_a, "A: "), **by_tier(groups_b, "B: ")}
    files = {
        "compare.md": render.compare_markdown(a, b, table).encode(),
        "compare.csv": render.compare_csv(table).encode(),
        "compare.png": plot_png(series, f"pass@1 per category: A {a.model} ({a.line}) vs B {b.model} ({b.line})"),
    }
    return render.compare_text(a, b, table), files


def by_tier(groups: list[Stats], prefix: str) -> dict[str, list[Stats]]:
    """The plot's series: per tier, its categories' stats (the whole-run row left out)."""
    series = {}
    for s in groups:
        if s.key[0] != "all":
            series.setdefault(f"{prefix}tier {s.key[1]}", []).append(s)
    return series
