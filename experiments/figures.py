"""An experiment's figures, readable at any size and ready for a paper.

In story order: modelled time, speedup over the baseline, fraction of the
ideal, flash traffic (grouped bars, one group per case, a geometric-mean group
on speedup and fraction of ideal), then a case x design heatmap of speedup with
the values in its cells. Each is written as PNG, SVG and PDF.

Bounded whatever the experiment's size: the cases wrap into rows of small
multiples sharing one y axis (at most ``MAX_BARS_PER_ROW`` bars a row), and a
figure holds at most ``MAX_ROWS`` rows (the heatmap ``MAX_HEATMAP_CASES``
cases); more cases continue on further pages (``speedup-2.png``, ...), so no
figure is wider or taller than ``MAX_SIDE_PX``. One style for all: fonts from
``STYLE``, and every design keeps its colour (``design_colour``) in every
figure of every experiment. Bars that leave the axis (far outliers, above
Tukey's outer fence, so that one does not flatten the rest) are cut at its edge
and carry their value; so do zero or missing values that a log axis cannot
draw. Error bars are one standard deviation, where repeats ran.

Figures are built with matplotlib's object API (no pyplot): no global state, no
backend to choose, nothing to close.
"""

from __future__ import annotations

import logging
import math
import statistics
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import matplotlib
import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from cxlssd.experiments.spec import Experiment

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

log = logging.getLogger(__name__)
T = TypeVar("T")

FORMATS = ("png", "svg", "pdf")  # the PNG first: report.md embeds it
DPI = 150  # of the PNG (SVG and PDF are vector)
MAX_SIDE_PX = 2000  # no figure is wider or taller at DPI
MAX_BARS_PER_ROW = 48  # bar slots (a case's bars and the gap after them) in one row of small multiples
MAX_ROWS = 4  # rows of small multiples in one figure; more cases go on the next page
MAX_HEATMAP_CASES = 32  # heatmap rows in one figure (and the geometric mean's)
SLOT_IN = 0.22  # one bar's width
MIN_GROUP_IN = 1.0  # one case's group, at least: room for its label
ROW_IN = 2.4  # one row of small multiples, tick labels included
HEAD_IN = 0.9  # title and legend above the rows
LEFT_IN = 0.9  # y axis label and ticks
MIN_WIDTH_IN = 5.0
CELL_W_IN = 0.85  # a heatmap cell
CELL_H_IN = 0.3
HEATMAP_LABEL_CHARS = 32  # a case label's line, beside the heatmap
DESIGN_LABELS_IN = 0.8  # the heatmap's slanted design names above it
COLOUR_BAR_IN = 1.2  # the heatmap's colour bar and its label
TICK_FONT_PT = 8.0
GEOMEAN = "geomean"
EDGE = "#333333"

# One style for every figure: set here, applied around building and saving them.
STYLE: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs on every machine
    "font.size": 9,
    "axes.titlesize": 9,
    "figure.titlesize": 11,
    "axes.labelsize": 9,
    "xtick.labelsize": TICK_FONT_PT,
    "ytick.labelsize": TICK_FONT_PT,
    "legend.fontsize": 8.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.alpha": 0.35,
    "grid.linewidth": 0.6,
    "errorbar.capsize": 2,
    "savefig.dpi": DPI,
    "pdf.fonttype": 42,  # TrueType in the PDF (venues reject Type 3 fonts)
    "svg.fonttype": "path",
}

# Okabe and Ito's colour-blind-safe palette, one colour per shipped design (firmware/profiles).
DESIGN_COLOURS = {
    "base-cssd": "#999999",
    "skybyte-p": "#E69F00",
    "skybyte-c": "#56B4E9",
    "skybyte-w": "#009E73",
    "skybyte-cp": "#F0E442",
    "skybyte-wp": "#CC79A7",
    "skybyte-full": "#D55E00",
    "dram-only": "#0072B2",
}
# Paul Tol's muted palette for designs added later: picked by a hash of the name, so a
# design has the same colour in every experiment (two new ones may share one).
OTHER_COLOURS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255")


def design_colour(design: str) -> str:
    return DESIGN_COLOURS.get(design) or OTHER_COLOURS[zlib.crc32(design.encode()) % len(OTHER_COLOURS)]


@dataclass(frozen=True)
class Chart:
    """One bar figure: what it plots of a table row and how."""

    stem: str
    title: str
    ylabel: str
    value: Callable[[dict[str, Any]], float | None]
    spread: str | None  # the table column of the value's standard deviation
    log_scale: bool
    summary_key: str | None = None  # the geometric mean over the cases (summary()) as a last group
    reference: float | None = None  # a dashed line: the baseline's or the ideal's level
    percent: bool = False

    def tick(self, value: float) -> str:
        return f"{value:.0%}" if self.percent else compact(value)

    def text(self, value: float) -> str:
        return f"{value:.1%}" if self.percent else value_text(value)


@dataclass(frozen=True)
class Drawn:
    """A figure as built and the files it was saved in (PNG, SVG, PDF)."""

    caption: str
    figure: Figure
    files: tuple[Path, ...]


def compact(value: float) -> str:
    """A tick label: up to three significant digits, thousands as k, M, G."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def value_text(value: float) -> str:
    """A value written on a bar or in a cell, as the report's tables write it: two
    decimals below 10, one below 100, none below 1000, then k, M, G."""
    if abs(value) >= 1000:
        return compact(value)
    if value == 0:
        return "0"
    if abs(value) < 0.1:
        return f"{value:.2g}"
    return f"{value:.{2 if abs(value) < 10 else 1 if abs(value) < 100 else 0}f}"


def wrap_label(label: str, width_chars: int) -> str:
    """``label`` in lines of about ``width_chars``, broken after ``[ , = -`` where it can;
    nothing is added or dropped, so joining the lines gives the label back."""
    tokens, token = [], ""
    for char in label:
        token += char
        if char in "[,=-_":
            tokens.append(token)
            token = ""
    tokens.append(token)
    lines = [""]
    for token in filter(None, tokens):
        if lines[-1] and len(lines[-1]) + len(token) > width_chars:
            lines.append("")
        lines[-1] += token
    width = max(width_chars, 1)
    return "\n".join(line[i:i + width] for line in lines for i in range(0, len(line), width))


@contextmanager
def style() -> Iterator[None]:
    with matplotlib.rc_context(STYLE):
        yield


def charts(experiment: Experiment) -> list[Chart]:
    """The bar figures of ``experiment`` in story order (fraction of ideal only with an ideal)."""
    found = [
        Chart("modelled_ms", "modelled time (log scale)", "modelled time (ms)", lambda r: r["modelled_ms"],
              "modelled_ms_stdev", log_scale=True),
        Chart("speedup", f"speedup over {experiment.baseline} (modelled time, log scale)",
              f"speedup over {experiment.baseline} (x)", lambda r: r["speedup"], "speedup_stdev",
              log_scale=True, summary_key="speedup", reference=1.0),
    ]
    if experiment.ideal is not None:
        found.append(Chart("fraction_of_ideal", f"fraction of {experiment.ideal} performance",
                           f"of {experiment.ideal} performance", lambda r: r["fraction_of_ideal"],
                           "fraction_of_ideal_stdev", log_scale=False, summary_key="fraction_of_ideal",
                           reference=1.0, percent=True))
    found.append(Chart("flash_ops", "flash operations, reads + programs (log scale)", "flash operations",
                       lambda r: r["flash_reads"] + r["flash_programs"], None, log_scale=True))
    return found


def _axis_limits(values: list[float], chart: Chart) -> tuple[float, float]:
    """The y range: from the smallest value (0 on a linear axis) to the largest one
    inside Tukey's outer fence, Q3 + 3 IQR (of the logarithms on a log axis), and the
    reference, with room above for the values annotated there. Only a far outlier
    leaves the axis: the rest keep their resolution."""
    if chart.log_scale:
        values = [math.log10(v) for v in values if v > 0]
    if chart.reference is not None:
        values.append(math.log10(chart.reference) if chart.log_scale else chart.reference)
    if not values:
        return (0.1, 10.0) if chart.log_scale else (0.0, 1.0)
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
        fence = q3 + 3 * (q3 - q1)
        values = [v for v in values if v <= fence]
    low, high = min(values), max(values)
    if not chart.log_scale:
        low = min(low, 0.0)
        return low, high + max(high - low, 1e-9) * 0.25
    span = max(high - low, 0.6)
    return 10 ** (low - span * 0.1), 10 ** (high + span * 0.3)


def _log_ticks(ax: Axes, low: float, high: float) -> None:
    decades = math.log10(high / low)
    subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if decades <= 1 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: compact(v)))
    ax.yaxis.set_minor_locator(NullLocator())


def _annotate(ax: Axes, x: float, y: float, text: str, top: bool) -> None:
    """A value written along a bar: hanging from the axis' top edge (``top``) or
    standing on ``y``."""
    ax.annotate(text, (x, 1.0 if top else y), xycoords=("data", "axes fraction") if top else "data",
                xytext=(0, -2 if top else 2), textcoords="offset points", rotation=90, ha="center",
                va="top" if top else "bottom", fontsize=TICK_FONT_PT - 1, clip_on=False,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
                if top else None)


def _grid(groups: int, designs: int) -> tuple[int, int]:
    """Cases (groups) a row and rows a page: rows of equal length as far as they go."""
    most = max(1, MAX_BARS_PER_ROW // (designs + 1))
    rows = math.ceil(groups / most)
    per_row = most if rows > MAX_ROWS else math.ceil(groups / rows)
    return per_row, min(rows, MAX_ROWS)


def _pages(stem: str, items: Sequence[T], per_page: int, cases: int) -> list[tuple[str, list[T], str]]:
    """``items`` (the cases, then the geometric mean) in pages of ``per_page``: each
    page's file stem (``stem``, ``stem-2``, ...), items and what its title adds ("" when
    one page holds them all)."""
    pages = math.ceil(len(items) / per_page)
    found = []
    for page in range(pages):
        first, last = page * per_page + 1, min((page + 1) * per_page, cases)
        shown = "the geometric mean" if first > cases else f"cases {first}-{last} of {cases}"
        found.append((stem if page == 0 else f"{stem}-{page + 1}", list(items[first - 1:][:per_page]),
                      "" if pages == 1 else f" — {shown} (page {page + 1} of {pages})"))
    return found


def _draw_row(ax: Axes, groups: list[tuple[str, dict[str, tuple[float | None, float]]]], designs: list[str],
              chart: Chart, limits: tuple[float, float]) -> None:
    """One row of small multiples: per design one bar in each group (one call, one
    artist per design), values written where a bar leaves the axis or cannot be
    drawn, and on the geometric-mean group."""
    low, high = limits
    width = 1.0 / (len(designs) + 1)
    for i, design in enumerate(designs):
        offset = (i - (len(designs) - 1) / 2) * width
        bars = [(g + offset, *values[design], label) for g, (label, values) in enumerate(groups)]
        drawable = [(x, value, spread) for x, value, spread, _ in bars
                    if value is not None and (value > 0 or not chart.log_scale)]
        if drawable:
            xs, values, spreads = zip(*drawable, strict=True)
            ax.bar(xs, values, width, label=design, color=design_colour(design), edgecolor=EDGE,
                   linewidth=0.4, yerr=spreads if any(spreads) else None, ecolor=EDGE,
                   error_kw={"elinewidth": 0.8})
        for x, value, _, label in bars:
            if value is None or (chart.log_scale and value <= 0):
                _annotate(ax, x, low, "n/a" if value is None else chart.text(value), top=False)
            elif value > high or label == GEOMEAN:
                _annotate(ax, x, value, chart.text(value), top=value > high)
    if groups[-1][0] == GEOMEAN and len(groups) > 1:
        ax.axvline(len(groups) - 1.5, color=EDGE, linewidth=0.8, linestyle=":")


def _bar_pages(experiment: Experiment, chart: Chart, table: list[dict[str, Any]],
               summary: dict[str, dict[str, float | None]]) -> list[tuple[str, Figure]]:
    designs = list(experiment.designs)
    cell = {(r["case"], r["design"]): r for r in table}
    groups: list[tuple[str, dict[str, tuple[float | None, float]]]] = []
    for case in dict.fromkeys(r["case"] for r in table):
        bars = {}
        for design in designs:
            row = cell.get((case, design))
            spread = row.get(chart.spread) if row and chart.spread else None
            bars[design] = (chart.value(row) if row else None, spread or 0.0)
        groups.append((case, bars))
    cases = len(groups)
    if chart.summary_key is not None:
        groups.append((GEOMEAN, {d: (summary[d][chart.summary_key], 0.0) for d in designs}))
    low, high = _axis_limits([v for _, bars in groups for v, _ in bars.values() if v is not None], chart)
    per_row, rows_max = _grid(len(groups), len(designs))
    pages = _pages(chart.stem, groups, per_row * rows_max, cases)
    group_in = max(MIN_GROUP_IN, (len(designs) + 1) * SLOT_IN)
    width_in = min(MAX_SIDE_PX / DPI, max(MIN_WIDTH_IN, LEFT_IN + per_row * group_in))
    label_chars = int(group_in / (0.6 * TICK_FONT_PT / 72))
    legend = [Patch(facecolor=design_colour(d), edgecolor=EDGE, linewidth=0.5, label=d) for d in designs]
    legend_columns = max(1, min(len(designs), int(width_in / (0.4 + 0.07 * max(map(len, designs))))))
    if len(pages) > 1:
        log.info("%s: %d cases on %d pages", chart.stem, cases, len(pages))
    built = []
    for name, chunk, shown in pages:
        rows = math.ceil(len(chunk) / per_row)
        fig = Figure(figsize=(width_in, HEAD_IN + rows * ROW_IN), dpi=DPI, layout="constrained")
        axes = fig.subplots(rows, 1, sharey=True, squeeze=False)[:, 0]
        for row_index, ax in enumerate(axes):
            row_groups = chunk[row_index * per_row:(row_index + 1) * per_row]
            _draw_row(ax, row_groups, designs, chart, (low, high))
            ax.set_xticks(range(len(row_groups)), [wrap_label(label, label_chars) for label, _ in row_groups])
            for tick, (label, _) in zip(ax.get_xticklabels(), row_groups, strict=True):
                tick.set_fontweight("bold" if label == GEOMEAN else "normal")
            ax.tick_params(axis="x", length=0)
            ax.set_xlim(-0.5, per_row - 0.5)
            if chart.reference is not None:
                ax.axhline(chart.reference, color=EDGE, linewidth=0.8, linestyle="--", zorder=0.5)
        ax = axes[0]
        if chart.log_scale:
            ax.set_yscale("log")
            _log_ticks(ax, low, high)
        else:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: chart.tick(v)))
        ax.set_ylim(low, high)
        fig.supylabel(chart.ylabel, fontsize=STYLE["axes.labelsize"])
        # The title heads the legend: a suptitle and a legend outside the axes would overlap.
        fig.legend(handles=legend, loc="outside upper center", ncols=legend_columns, frameon=False,
                   title=f"{experiment.name}: {chart.title}{shown}",
                   title_fontproperties={"size": STYLE["figure.titlesize"]})
        built.append((name, fig))
    return built


def _heatmap_pages(experiment: Experiment, table: list[dict[str, Any]],
                   summary: dict[str, dict[str, float | None]]) -> list[tuple[str, Figure]]:
    """Speedup per case (rows) and design (columns), the value in each cell; the
    colour is the log of the speedup, centred on 1 (blue faster, red slower)."""
    designs = list(experiment.designs)
    speedup = {(r["case"], r["design"]): r["speedup"] for r in table}
    rows = [(case, [speedup.get((case, d)) for d in designs])
            for case in dict.fromkeys(r["case"] for r in table)]
    cases = len(rows)
    rows.append((GEOMEAN, [summary[d]["speedup"] for d in designs]))
    logs = [math.log2(v) for _, values in rows for v in values if v]
    low, high = min([-1.0, *logs]), max([1.0, *logs])  # 0.5x to 2x at least
    norm = TwoSlopeNorm(0.0, low, high)
    cmap = colormaps["RdBu"].with_extremes(bad="#dddddd")
    longest = min(HEATMAP_LABEL_CHARS, max(len(case) for case, _ in rows))
    label_in = 0.3 + 0.6 * TICK_FONT_PT / 72 * longest
    cell_in = min(CELL_W_IN, (MAX_SIDE_PX / DPI - label_in - COLOUR_BAR_IN) / len(designs))
    width_in = max(MIN_WIDTH_IN, label_in + len(designs) * cell_in + COLOUR_BAR_IN)
    built = []
    for name, chunk, shown in _pages("speedup_heatmap", rows, MAX_HEATMAP_CASES + 1, cases):
        grid = np.ma.masked_invalid(np.array([[math.log2(v) if v else np.nan for v in values]
                                              for _, values in chunk], dtype=float))
        fig = Figure(figsize=(width_in, HEAD_IN + DESIGN_LABELS_IN + len(chunk) * CELL_H_IN), dpi=DPI,
                     layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        for y, (_, values) in enumerate(chunk):
            for x, value in enumerate(values):
                dark = value is not None and value > 0 and abs(norm(math.log2(value)) - 0.5) > 0.3
                ax.text(x, y, "—" if value is None else value_text(value), ha="center", va="center",
                        fontsize=TICK_FONT_PT, color="white" if dark else "black")
        labels = [case for case, _ in chunk]
        ax.set_yticks(range(len(chunk)), [wrap_label(case, HEATMAP_LABEL_CHARS) for case in labels])
        ax.set_xticks(range(len(designs)), designs, rotation=30, ha="left", rotation_mode="anchor")
        ax.tick_params(top=True, labeltop=True, bottom=False, labelbottom=False, length=0)
        for tick, case in zip(ax.get_yticklabels(), labels, strict=True):
            tick.set_fontweight("bold" if case == GEOMEAN else "normal")
        if labels[-1] == GEOMEAN:
            ax.axhline(len(chunk) - 1.5, color="black", linewidth=1.2)
        ax.grid(False)
        ax.spines[:].set_visible(False)
        step = math.ceil((high - low) / 8)  # powers of 2^step: at most nine ticks
        ticks = list(range(-(math.floor(-low) // step) * step, math.floor(high) + 1, step))
        bar = fig.colorbar(image, ax=ax, shrink=min(1.0, 4 / max(len(chunk), 1) + 0.3), pad=0.02)
        bar.ax.yaxis.set_major_locator(FixedLocator(ticks))
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{compact(2.0 ** v)}x"))
        bar.set_label(f"speedup over {experiment.baseline}")
        fig.suptitle(f"{experiment.name}: speedup over {experiment.baseline} per case and design{shown}")
        built.append((name, fig))
    return built


CAPTIONS = {  # by chart stem; {baseline} and {ideal} are the experiment's
    "modelled_ms": "Modelled time per case and design (log scale; error bars, where points were repeated: "
                   "one standard deviation).",
    "speedup": "Speedup over {baseline} per case, and the geometric mean over the cases (log scale; "
               "dashed: {baseline}).",
    "fraction_of_ideal": "Fraction of {ideal}'s performance per case, and the geometric mean over the cases "
                         "(dashed: {ideal}).",
    "flash_ops": "Flash operations (reads + programs) per case and design (log scale; zeros written).",
    "speedup_heatmap": "Speedup over {baseline} per case (rows) and design (columns), the geometric mean "
                       "as the last row (blue: faster, red: slower).",
}


def build_figures(experiment: Experiment, table: list[dict[str, Any]],
                  summary: dict[str, dict[str, float | None]]) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) of every figure, in story order."""
    with style():
        built = [(name, chart.stem, fig) for chart in charts(experiment)
                 for name, fig in _bar_pages(experiment, chart, table, summary)]
        built += [(name, "speedup_heatmap", fig) for name, fig in _heatmap_pages(experiment, table, summary)]
    return [(name, CAPTIONS[stem].format(baseline=experiment.baseline, ideal=experiment.ideal), fig)
            for name, stem, fig in built]


def write_figures(experiment: Experiment, table: list[dict[str, Any]],
                  summary: dict[str, dict[str, float | None]], out_dir: Path,
                  formats: tuple[str, ...] = FORMATS) -> list[Drawn]:
    """Build every figure and save it in each of ``formats`` in ``out_dir``."""
    drawn = []
    for stem, caption, fig in build_figures(experiment, table, summary):
        files = tuple(out_dir / f"{stem}.{fmt}" for fmt in formats)
        with style():
            for path in files:
                fig.savefig(path, metadata={"Title": f"{experiment.name}: {stem}"})
                fig.set_layout_engine("none")  # laid out for the first format: the same for the others
        drawn.append(Drawn(caption, fig, files))
    return drawn
