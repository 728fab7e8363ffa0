"""The report's picture: pass@1 per category, a labelled bar per tier (per run and tier when
comparing) with its interval as an error bar, and a red cross and count over every bar whose
rollouts had harness errors."""

import io

from matplotlib.figure import Figure

from ptenv.report.bootstrap import NAME
from ptenv.report.stats import Stats, order

SIZE = (8, 4.5)  # inches, at DPI: 800 x 450 pixels
DPI = 100


def plot_png(series: dict[str, list[Stats]], title: str) -> bytes:
    """A PNG of pass@1: series label -> its per category stats, bars grouped by category."""
    fig = figure(series, title)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return out.getvalue()


def figure(series: dict[str, list[Stats]], title: str) -> Figure:
    categories = sorted({s.key[0] for stats in series.values() for s in stats}, key=lambda c: order((c,)))
    fig = Figure(figsize=SIZE, dpi=DPI)  # no pyplot: no global state, no display backend
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    errors_labelled = False
    for i, (label, stats) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        xs = [categories.index(s.key[0]) + offset for s in stats]
        values = [s.pass_at[0].value for s in stats]
        spans = [s.pass_at[0].interval or (v, v) for s, v in zip(stats, values)]  # one prompt: no error bar
        yerr = [[v - low for v, (low, _) in zip(values, spans)], [high - v for v, (_, high) in zip(values, spans)]]
        bars = ax.bar(xs, values, width, label=label, yerr=yerr, capsize=2, error_kw={"elinewidth": 0.8})
        ax.bar_label(bars, fmt="%.2f", fontsize=7)  # over the error bar; a 0.00 bar is otherwise no bar at all
        marked = [(x, high, s.harness_errors) for x, (_, high), s in zip(xs, spans, stats) if s.harness_errors]
        if marked:
            ax.scatter([x for x, _, _ in marked], [high + 0.1 for _, high, _ in marked], marker="x", color="red",
                       label=None if errors_labelled else "harness errors (count)")
            errors_labelled = True
        for x, high, count in marked:
            ax.annotate(str(count), (x, high + 0.13), ha="center", color="red", fontsize=8)
    ax.set_xticks(range(len(categories)), categories)
    ax.set_ylim(0, 1.2)
    ax.set_ylabel(f"pass@1; error bars: {NAME}", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")  # where it hides the fewest bars
    fig.tight_layout()  # rearranges inside the figure; the size stays SIZE
    return fig
