"""python -m ptenv.report: a vf-eval run of pytorch-env per category and tier, with pass@k, failure
reasons and a plot, and 95% intervals (ptenv.report.bootstrap); or two runs side by side.

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

from ptenv.report.build import build_comparison, build_report
from ptenv.report.runs import RunError, load_run
from ptenv.inside.protocol import one_line


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
