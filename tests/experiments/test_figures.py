"""Figures: bounded in size and aspect whatever the number of cases, every case and
design named, the geometric mean, error bars, values where bars leave the axis,
one colour per design, and report.md embedding them in story order. Checked on
matplotlib's artists (and the saved files' sizes), never on pixels; no VM."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from PIL import Image

from cxlssd.experiments.figures import (
    DESIGN_COLOURS,
    DPI,
    FORMATS,
    GEOMEAN,
    MAX_SIDE_PX,
    build_figures,
    design_colour,
    value_text,
    wrap_label,
    write_figures,
)
from cxlssd.experiments.report import derive, summary, write_results
from cxlssd.experiments.spec import Experiment, experiment_from_dict
from cxlssd.firmware.profile import available_profiles

DESIGNS = ["base-cssd", "skybyte-p", "skybyte-c", "skybyte-w", "skybyte-cp", "skybyte-wp", "skybyte-full",
           "dram-only"]
# Twelve cases: short names and long swept ones, as a real sweep gives.
WORKLOADS = [
    {"name": name, "command": ["chase"]} for name in ("bfs", "bc", "radix", "srad", "dlrm", "tpcc")
] + [
    {"name": "kvstore-footprint-sweep",
     "command": ["kvstore", "--footprint", "{footprint}", "--mix", "{mix}"],
     "sweep": {"footprint": ["16M", "32M", "64M"], "mix": ["a", "b"]}},
]
OUTLIER = ("bc", "dram-only", 5000.0)  # a speedup far above the others: cut at the axis' top, annotated


def synthetic_rows(experiment: Experiment, seed: int = 7) -> dict[str, dict[str, Any]]:
    """A points file's rows: per case a baseline time and flash traffic; each design
    some factor faster (dram-only most, no flash), every repetition a little apart."""
    rng = random.Random(seed)
    cases = dict.fromkeys(p.case for p in experiment.points())
    base_ms = {case: 10 ** rng.uniform(0.5, 2.7) for case in cases}
    factor = {(case, design): 1.0 if design == experiment.baseline else rng.uniform(0.8, 6.0)
              for case in base_ms for design in experiment.designs}
    factor.update({(case, "dram-only"): rng.uniform(4.0, 30.0) for case in base_ms})
    factor[OUTLIER[:2]] = OUTLIER[2]
    rows = {}
    for point in experiment.points():
        ms = base_ms[point.case] / factor[point.case, point.design] * rng.uniform(0.97, 1.03)
        flash = 0 if point.design == "dram-only" else int(1e5 / factor[point.case, point.design])
        rows[point.key] = {
            "key": point.key, "case": point.case, "workload": point.workload, "design": point.design,
            "rep": point.rep, "kind": "live", "modelled_ns": int(ms * 1e6), "local_ns": int(ms * 4e5),
            "device_stall_ns": int(ms * 6e5), "instructions": 10**6, "check_ok": True, "exit_status": 0,
            "device": {"requests": 1000, "long_delays": 0}, "flash": {"reads": flash, "programs": flash // 4},
        }
    return rows


def _texts(figure: Figure) -> list[str]:
    """Every text of the figure as drawn: tick labels (wrapped lines joined again),
    legend entries, annotations and cell values."""
    found = [text.get_text() for text in figure.legends[0].get_texts()] if figure.legends else []
    for ax in figure.axes:
        found += [t.get_text().replace("\n", "") for t in ax.get_xticklabels() + ax.get_yticklabels()]
        found += [t.get_text() for t in ax.texts]
    return found


def test_a_12_by_8_table_gives_bounded_figures_naming_every_case_and_design(tmp_path: Path) -> None:
    definition = {"name": "wide", "designs": DESIGNS, "repeat": 2, "workloads": WORKLOADS}
    experiment = experiment_from_dict(definition, "wide.yaml")
    table = derive(experiment, synthetic_rows(experiment))
    means = summary(experiment, table)
    drawn_figures = write_figures(experiment, table, means, tmp_path, formats=("png",))  # PNG: the sizes
    cases = list(dict.fromkeys(r["case"] for r in table))
    assert len(cases) == 12 and len(experiment.designs) == 8
    names = [figure.files[0].stem for figure in drawn_figures]
    assert names == ["modelled_ms", "speedup", "fraction_of_ideal", "flash_ops", "speedup_heatmap"]
    for drawn in drawn_figures:
        width_in, height_in = drawn.figure.get_size_inches()
        with Image.open(drawn.files[0]) as png:
            assert png.size == (round(width_in * DPI), round(height_in * DPI))
            assert max(png.size) <= MAX_SIDE_PX
            assert 0.5 <= png.size[0] / png.size[1] <= 3.5, (drawn.files[0].name, png.size)
        texts = _texts(drawn.figure)
        assert set(cases) <= set(texts) and set(DESIGNS) <= set(texts), drawn.files[0].name
        if drawn.files[0].stem in ("speedup", "fraction_of_ideal", "speedup_heatmap"):
            assert GEOMEAN in texts
    figures = {figure.files[0].stem: figure.figure for figure in drawn_figures}
    # Legend outside the data: above every axes of the figure.
    for stem in ("modelled_ms", "speedup", "fraction_of_ideal", "flash_ops"):
        figure = figures[stem]
        figure.canvas.draw()
        legend_bottom = figure.legends[0].get_window_extent().y0
        assert all(ax.get_window_extent().y1 <= legend_bottom for ax in figure.axes), stem
        # The cases wrap into rows of small multiples sharing one y axis.
        assert len(figure.axes) == 3 and figure.axes[1].get_ylim() == figure.axes[0].get_ylim()
    # Repeats ran: error bars on time; the outlier's bar leaves the speedup axis, its value written.
    time_bars = [c for ax in figures["modelled_ms"].axes for c in ax.containers
                 if isinstance(c, BarContainer)]
    assert all(c.errorbar is not None for c in time_bars) and sum(map(len, time_bars)) == 12 * 8
    outlier = next(r for r in table if (r["case"], r["design"]) == OUTLIER[:2])
    assert value_text(outlier["speedup"]) in _texts(figures["speedup"])
    assert outlier["speedup"] > figures["speedup"].axes[0].get_ylim()[1]
    # The geometric means are written on their bars, and in the heatmap's last row.
    for design in DESIGNS:
        assert value_text(means[design]["speedup"]) in _texts(figures["speedup"])
        assert f"{means[design]['fraction_of_ideal']:.1%}" in _texts(figures["fraction_of_ideal"])
    heatmap_texts = [t.get_text() for t in figures["speedup_heatmap"].axes[0].texts]
    assert heatmap_texts == [value_text(r["speedup"]) for r in table] + [
        value_text(means[d]["speedup"]) for d in DESIGNS]
    # Each design has its colour in every bar figure (dram-only has no flash bars: its zeros are written).
    for stem in ("modelled_ms", "speedup", "fraction_of_ideal", "flash_ops"):
        for ax in figures[stem].axes:
            bars = [c for c in ax.containers if isinstance(c, BarContainer)]
            drawn = [d for d in DESIGNS if stem != "flash_ops" or d != "dram-only"]
            assert [c.get_label() for c in bars] == drawn
            assert all(bar.get_facecolor() == to_rgba(design_colour(c.get_label()))
                       for c in bars for bar in c)


def test_the_report_embeds_every_figure_in_story_order_with_pdf_and_svg(tmp_path: Path) -> None:
    experiment = experiment_from_dict({"name": "s", "designs": ["base-cssd", "skybyte-full", "dram-only"],
                                       "workloads": WORKLOADS[:2]}, "s.yaml")
    written = write_results(experiment, synthetic_rows(experiment), tmp_path)
    names = ["modelled_ms", "speedup", "fraction_of_ideal", "flash_ops", "speedup_heatmap"]
    assert [path.name for path in written["plots"]] == [f"{n}.{fmt}" for n in names for fmt in FORMATS]
    assert all(path.stat().st_size > 0 for path in written["plots"])
    report = (tmp_path / "report.md").read_text()
    embedded = [line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")]
    assert embedded == [f"{name}.png" for name in names]
    assert "*Figure 2.* Speedup over base-cssd per case" in report
    assert "([SVG](speedup.svg), [PDF](speedup.pdf))" in report
    assert report.index("## Over the cases") < report.index("## Figures") < report.index("## Per case")


def test_many_cases_continue_on_further_pages_each_bounded() -> None:
    workloads = [{"name": f"w{n:03d}", "command": ["chase"]} for n in range(45)]
    experiment = experiment_from_dict({"name": "many", "designs": DESIGNS, "workloads": workloads}, "m.yaml")
    table = derive(experiment, synthetic_rows(experiment))
    built = build_figures(experiment, table, summary(experiment, table))
    stems = [stem for stem, _, _ in built]
    assert stems[:4] == ["modelled_ms", "modelled_ms-2", "modelled_ms-3", "speedup"]
    for prefix in ("modelled_ms", "speedup", "speedup_heatmap"):
        pages = [figure for stem, _, figure in built if stem.split("-")[0] == prefix]
        assert len(pages) > 1
        shown = [text for figure in pages for text in _texts(figure)]
        assert {f"w{n:03d}" for n in range(45)} <= set(shown), prefix
        for figure in pages:
            width_in, height_in = figure.get_size_inches()
            assert max(width_in, height_in) * DPI <= MAX_SIDE_PX and 0.5 <= width_in / height_in <= 3.5


def test_a_small_experiment_stays_one_compact_row() -> None:
    experiment = experiment_from_dict({"name": "s", "designs": ["base-cssd", "dram-only"],
                                       "workloads": WORKLOADS[:2]}, "s.yaml")
    table = derive(experiment, synthetic_rows(experiment))
    for stem, _, figure in build_figures(experiment, table, summary(experiment, table)):
        width_in, height_in = figure.get_size_inches()
        assert width_in <= 6 and 1 <= width_in / height_in <= 3.5, stem
        assert len(figure.axes) == (2 if stem == "speedup_heatmap" else 1)  # heatmap: and its colour bar


def test_every_shipped_design_has_its_own_colour_and_others_a_stable_one() -> None:
    assert set(DESIGN_COLOURS) == set(available_profiles())
    assert len(set(DESIGN_COLOURS.values())) == len(DESIGN_COLOURS)
    assert design_colour("my-design") == design_colour("my-design") != design_colour("base-cssd")


@pytest.mark.parametrize(("label", "width", "lines"), [
    ("bfs", 10, ["bfs"]),
    ("kvstore-footprint-sweep[footprint=16M,mix=a]", 16,
     ["kvstore-", "footprint-sweep[", "footprint=16M,", "mix=a]"]),
    ("averyveryverylongname", 8, ["averyver", "yverylon", "gname"]),
])
def test_long_case_labels_wrap_at_their_separators_and_lose_nothing(label: str, width: int,
                                                                     lines: list[str]) -> None:
    assert wrap_label(label, width).split("\n") == lines
