"""python -m ptenv.report: a vf-eval run of pytorch-env per category and tier, with pass@k, failure
reasons and a plot; or two runs side by side.

    python -m ptenv.report PATH [--tasks] [--out DIR]
    python -m ptenv.report --compare A B [--out DIR]

PATH (and A, B) is a vf-eval output directory or its results file, from either verifiers line
(classic results.jsonl, verifiers 0.4 traces.jsonl). Prints the report and writes report.md,
report.csv and report.png (compare.md, compare.csv, compare.png) into DIR, by default the run's
own directory (B's when comparing). Bad input is one line on stderr and exit status 1, with
nothing written.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ptenv.report import render
from ptenv.report.plot import plot_png
from ptenv.report.runs import Run, RunError, load_run
from ptenv.report.stats import Stats, group
from ptenv.sandbox.commands import one_line


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


def write_all(out: Path, files: dict[str, bytes]) -> None:
    """Every file to a temporary name first, then each renamed into place: none is ever half-written."""
    temporary = {}
    try:
        for name, data in files.items():
            fd, temporary[name] = tempfile.mkstemp(dir=out, prefix=f".{name}.")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for name, path in temporary.items():
            os.replace(path, out / name)
    finally:
        for path in temporary.values():
            if os.path.exists(path):
                os.unlink(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ptenv.report", description=__doc__.split("\n")[0])
    parser.add_argument("path", nargs="?", type=Path, help="a vf-eval output directory or its results file")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two runs side by side")
    parser.add_argument("--tasks", action="store_true", help="also report each task")
    parser.add_argument("--out", type=Path, help="where the files go (default: the run's directory, B's)")
    args = parser.parse_args(argv)
    if (args.path is None) == (args.compare is None):
        parser.error("give one run (PATH) or two (--compare A B)")
    if args.compare and args.tasks:
        parser.error("--tasks reports one run; --compare compares categories and tiers")
    try:
        if args.compare:
            runs = [load_run(path) for path in args.compare]
            text, files = build_comparison(*runs)
        else:
            runs = [load_run(args.path)]
            text, files = build_report(runs[0], args.tasks)
        out = args.out or runs[-1].path.parent
        write_all(out, files)
    except (RunError, OSError) as e:
        print(f"report: {one_line(e)}", file=sys.stderr)
        return 1
    print(text + f"\nwrote {', '.join(files)} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
