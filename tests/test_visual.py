"""What users see, checked without a browser: charts that read on a dark notebook theme, text
reports that fit an 80-column terminal, tables whose numbers line up.

The browser half (JupyterLab's light and dark themes, a 600 px wide notebook) is
tests/test_visual_browser.py.
"""
from __future__ import annotations

import dataclasses
import io
import re

import pytest

import colab_gpu
from colab_gpu import live
from colab_gpu.live.render import chart_figure, chart_png
from colab_gpu.render import WIDTH
from conftest import DATA, ROOT
from test_multigpu import box

XML = DATA / "nvidia-smi-xml"


def rgba(png: bytes):
    """The PNG's pixels as floats 0..1, with an alpha channel."""
    from matplotlib.image import imread

    pixels = imread(io.BytesIO(png), format="png")
    assert pixels.shape[2] == 4, "the chart has no alpha channel: it is drawn on an opaque box"
    return pixels


def assert_reads_on_light_and_dark(png: bytes) -> None:
    """No white box in a dark notebook (the background shows through), and no black text or
    frame that a dark background would swallow (nor white that a light one would)."""
    pixels = rgba(png)
    assert pixels[0, 0, 3] == 0 and (pixels[..., 3] == 0).mean() > 0.5
    opaque = pixels[pixels[..., 3] > 0.9][:, :3]
    assert len(opaque), "nothing is drawn"
    assert not (opaque.max(axis=1) < 0.2).any(), "near-black pixels: invisible on a dark theme"
    assert not (opaque.min(axis=1) > 0.95).any(), "near-white pixels: invisible on a light theme"


def small_search():
    return colab_gpu.find_batch(lambda size: None, max=64, device="cpu", progress=False)


def test_the_find_batch_chart_reads_on_a_dark_theme():
    from colab_gpu.batch.render import chart_png

    assert_reads_on_light_and_dark(chart_png(small_search()))


def test_the_live_run_chart_reads_on_a_dark_theme(fast_live_sampling):
    sampler, _ = live.start(demo=True, interval=0.01)
    try:
        sampler.wait(5, timeout=10)
    finally:
        record = live.stop()
    assert_reads_on_light_and_dark(chart_png(record))
    # The demo trace has no memory: its chart leaves the panel out; from NVML (a failed read)
    # the panel stays, without a made-up 0-1 scale.
    assert "memory used (GiB)" not in [axes.get_title(loc="left") for axes in chart_figure(record).axes]
    live_run = dataclasses.replace(record, recorded=False)
    memory = next(axes for axes in chart_figure(live_run).axes if axes.get_title(loc="left") == "memory used (GiB)")
    assert not memory.get_yticks().size


def statuses():
    """Status reports from real recordings: the advice differs with the GPUs."""
    yield colab_gpu.status(path=str(ROOT / "colab_gpu" / "data" / "tesla-t4.xml"))
    yield colab_gpu.status(box("tesla-t4.xml", "tesla-t4.xml"))
    yield colab_gpu.status(path=str(XML / "a100-sxm4-v12.xml"))
    yield colab_gpu.status()  # this machine: no GPU


def words(text: str) -> str:
    return " ".join(text.split())


def test_advice_fits_an_80_column_terminal_without_losing_a_word(clean_env):
    """A terminal breaks a longer line at any character: advice of 200 characters came out cut
    mid-word. Folded, each advice line fits, keeps every word in order, and continues under
    its message, not under "tip:"."""
    for status in statuses():
        text = str(status)
        assert status.advice
        for advice in status.advice:
            first = f"{advice.level}: "
            block = text[text.index(first + advice.message.split()[0]):].split("\n")
            lines = [block[0]]
            for line in block[1:]:
                if not line.startswith(" " * len(first)):
                    break
                lines.append(line)
            assert all(len(line) <= WIDTH for line in lines), lines
            assert words(" ".join(lines)) == words(first + advice.message)


def test_the_allocator_key_listing_fits_an_80_column_terminal():
    """`%alloc_conf --keys` printed a 100-column row per key: the default and the versions
    wrapped mid-word, in a terminal and in a notebook alike."""
    from colab_gpu.allocator.render import render_keys

    listing = render_keys((2, 13))
    assert [line for line in listing.splitlines() if len(line) > WIDTH] == []
    # a key the installed torch lacks says so, and which torch that is
    assert "roundup_bypass_threshold_mb  torch 1.13, removed in 2.0  (not in torch 2.13)" in listing
    assert "expandable_segments  torch 2.1+\n    boolean, default False: grow one segment" in listing


def test_the_find_batch_text_table_aligns_numbers_right_and_words_left():
    result = small_search()
    table = str(result).splitlines()[1:2 + len(result.trials)]
    header, rows = table[0], table[1:]
    starts = {name: header.index(name) for name in ("outcome", "peak memory")}
    for row, trial in zip(rows, result.trials):
        assert row[starts["outcome"]:].startswith(trial.outcome), row  # "fits" under "outcome"
        size_end = header.index("size") + len("size")
        assert row[:size_end].strip() == str(trial.size) and row[size_end - 1] != " ", row


def test_alloc_conf_warnings_are_labelled_as_in_the_status_card():
    html = colab_gpu.alloc_conf(["max_split_size_mb=128", "expandable_segments=True"])._repr_html_()
    assert "<li class='warning'><b>warning</b> max_split_size_mb with expandable_segments" in html


def test_the_status_card_names_temperature_and_state_as_the_text_report_does():
    """The card's power row read "26.8 W of 70 W, 40 °C, P0": a bare P0 means nothing to a student."""
    status = colab_gpu.status(path=str(XML / "tesla-t4.xml"))
    assert "temperature 40 °C, state P0" in str(status)
    assert "26.8&nbsp;W of 70&nbsp;W, temperature 40&nbsp;°C, state P0" in status._repr_html_()


def card_rows(status):
    """Each GPU's rows, {label: value}, as the text report and as the HTML card show them (a
    folded text row unfolded, the HTML's tags and no-break spaces dropped)."""
    from test_narrow_views import Text

    text_rows, rows = [], None
    for line in str(status).splitlines():
        if line.startswith("GPU "):
            rows = {}
            text_rows.append(rows)
        elif rows is not None and line.startswith(" " * 14):
            rows[list(rows)[-1]] += " " + line.strip()  # a folded row goes on: the last one read
        elif rows is not None and line.startswith("  ") and line[2] != " ":
            label = line[2:13].strip()
            rows[label] = line[14:]
        else:
            rows = None
    row = re.compile(r"<tr><td class='cgpu-muted cgpu-label'>(.*?)</td><td>(.*?)</td></tr>")
    html_rows = [{label: str(Text(value)).replace("\xa0", " ").strip() for label, value in row.findall(gpu)}
                 for gpu in status._repr_html_().split("<h4>")[1:]]
    return text_rows, html_rows


@pytest.mark.parametrize("source", [*sorted(path.name for path in XML.glob("*.xml")), "NVML"])
def test_the_text_report_and_the_card_word_every_gpu_row_alike(source):
    """The two renderers wrote the rows each their own way and drifted apart: "1.01 GiB used /
    15.00 GiB" in the text, "used of" in the card; "slowed by:" and "slowed by"; "bus" and "; bus"."""
    status = colab_gpu.status(box("tesla-t4.xml", "rtx-3090-v12.xml")) if source == "NVML" else \
        colab_gpu.status(path=str(XML / source))
    text_rows, html_rows = card_rows(status)
    assert len(text_rows) == len(html_rows) == len(status.snapshot.gpus)
    for text, html in zip(text_rows, html_rows):
        listed = {"process", "processes", "where"}  # laid out as columns in the text, a list or a bar in HTML
        assert {label: value for label, value in text.items() if label not in listed} == \
            {label: value for label, value in html.items() if label not in listed}
