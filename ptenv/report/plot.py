"""The report's picture: pass@1 per category, a labelled bar per tier (per run and tier when
comparing), with a red cross and count over every bar whose rollouts had harness errors."""

import io

from matplotlib.figure import Figure

from ptenv.report.stats import Stats, order

SIZE = (8, 4.5)  # inches, at DPI: 800 x 450 pixels
DPI = 100


def plot_png(series: dict[str, list[Stats]], title: str) -> bytes:
    """A PNG of pass@1: series label -> its per category stats, bars grouped by category."""
    categories = sorted({s.key[0] for stats in series.values() for s in stats}, key=lambda c: order((c,)))
    fig = Figure(figsize=SIZE, dpi=DPI)  # no pyplot: no global state, no display backend
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    errors_labelled = False
    for i, (label, stats) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        xs = [categories.index(s.key[0]) + offset for s in stats]
        bars = ax.bar(xs, [s.pass_at[0] for s in stats], width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)  # a 0.00 bar is otherwise no bar at all
        marked = [(x, s) for x, s in zip(xs, stats) if s.harness_errors]
        if marked:
            ax.scatter([x for x, _ in marked], [s.pass_at[0] + 0.1 for _, s in marked], marker="x", color="red",
                       label=None if errors_labelled else "harness errors (count)")
            errors_labelled = True
        for x, s in marked:
            ax.annotate(str(s.harness_errors), (x, s.pass_at[0] + 0.13), ha="center", color="red", fontsize=8)
    ax.set_xticks(range(len(categories)), categories)
    ax.set_ylim(0, 1.2)
    ax.set_ylabel("pass@1")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")  # where it hides the fewest bars
    fig.tight_layout()  # rearranges inside the figure; the size stays SIZE
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return out.getvalue()
