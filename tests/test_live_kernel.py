"""The live widget through a real Jupyter kernel (nbclient), in both environments.

What a front end receives: the widget is displayed, the sampler thread's updates reach the
front end as widget state while other cells run, and --stop (or %reload_ext, which stops the
monitor) replaces the widget's output by the run's last state, static HTML and a PNG, which a
saved notebook keeps, and leaves its summary and chart.
"""
from __future__ import annotations

import base64
import re

import pytest

from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.kernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def execute(notebook, **options):
    """Execute ``notebook`` in place; the (cell index, message type, content) of every output
    message: the saved notebook keeps only what update_display_data left of an output."""
    messages = []

    class Recording(nbclient.NotebookClient):
        def process_message(self, msg, cell, cell_index):
            messages.append((cell_index, msg["msg_type"], msg["content"]))
            return super().process_message(msg, cell, cell_index)

    Recording(notebook, timeout=60, kernel_name="python3", **options).execute()
    return messages


def shown_first(messages, cell: int):
    """What the cell displayed first, as the front end received it (before any update)."""
    return next(content for index, kind, content in messages if index == cell and kind == "display_data")


def test_widget_updates_reach_the_front_end_and_stop_leaves_a_static_view_and_a_chart(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext colab_gpu"),
        nbformat.v4.new_code_cell("%gpu_status --live --demo --interval 0.1"),
        nbformat.v4.new_code_cell("import time; time.sleep(2.5)  # a 'training' cell"),
        nbformat.v4.new_code_cell("%gpu_status --stop"),
        nbformat.v4.new_code_cell("%gpu_status --live --demo --interval 0.1"),
        nbformat.v4.new_code_cell("time.sleep(0.3)"),
        nbformat.v4.new_code_cell("%reload_ext colab_gpu"),
    ])
    messages = execute(notebook, store_widget_state=True)
    widget = shown_first(messages, 1)
    model_id = widget["data"][WIDGET_VIEW]["model_id"]
    # Where the widget cannot be drawn (a terminal front end), its text names it, not its CSS.
    assert widget["data"]["text/plain"] == ("Live GPU monitor (replay of nanogpt-8gpu-training_gpus0-3.csv); "
                                            "%gpu_status --stop leaves its summary and chart")
    display_id = widget["transient"]["display_id"]
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"][model_id]["state"]
    # The last value the front end received came from the sampler thread after --stop.
    assert "REPLAY of a recorded trace" in state["value"]
    samples = int(re.search(r"stopped at \d\d:\d\d:\d\d by %gpu_status --stop, (\d+) samples",
                            state["value"])[1])
    assert samples >= 20  # about 2.5 s at 0.1 s, the shortest interval
    # --stop replaced the widget's output (sent from the --stop cell, by its display id) ...
    assert [(index, content["transient"]["display_id"]) for index, kind, content in messages
            if kind == "update_display_data"][:1] == [(3, display_id)]
    # ... so the saved notebook holds a view any viewer draws without a kernel: no widget
    # ("Error displaying widget: model not found" in a reopened notebook), its last state.
    (saved,) = notebook.cells[1].outputs
    assert saved.output_type == "display_data" and sorted(saved.data) == ["image/png", "text/html", "text/plain"]
    assert re.fullmatch(rf"Live GPU monitor \(replay of nanogpt-8gpu-training_gpus0-3\.csv\): stopped at "
                        rf"\d\d:\d\d:\d\d by %gpu_status --stop, {samples} samples over [\d.]+ s", saved.data["text/plain"])
    assert f"by %gpu_status --stop, {samples} samples" in saved.data["text/html"] and "<svg" not in saved.data["text/html"]
    assert f"data:image/png;base64,{saved.data['image/png']}" in saved.data["text/html"]
    assert base64.b64decode(saved.data["image/png"]).startswith(b"\x89PNG")
    assert notebook.cells[2].outputs == []  # nothing printed into the other cell
    stop_output = notebook.cells[3].outputs[0]
    assert "Live monitor stopped" in stop_output.data["text/plain"]
    assert "data:image/png;base64," in stop_output.data["text/html"]
    # %reload_ext stopped the second run: its cell shows what --stop would have shown ...
    reload_output = notebook.cells[6].outputs
    assert [o.output_type for o in reload_output] == ["display_data"]
    assert reload_output[0].data["text/plain"].startswith("Live monitor stopped: ")
    assert "data:image/png;base64," in reload_output[0].data["text/html"]
    # ... and its live display became static too, saying what stopped it.
    (second,) = notebook.cells[4].outputs
    assert WIDGET_VIEW not in second.data
    assert " by %unload_ext or %reload_ext colab_gpu, " in second.data["text/plain"]


def test_the_widget_text_of_a_long_recording_name_keeps_the_stop_hint(monkeypatch, tmp_path):
    """ipywidgets (7 and 8) cut a widget's text/plain at 110 characters: a front end that
    cannot draw the widget showed "...; %gpu_status --stop leaves its summary and…" or, for a
    longer file name, lost the hint how to stop the monitor."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    recording = tmp_path / "resnet50-finetune-a100-lr3e-4-warmup-run3.csv"
    recording.write_bytes((ROOT / "tests" / "data" / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv").read_bytes())
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext colab_gpu"),
        nbformat.v4.new_code_cell(f"%gpu_status --live --from {recording} --interval 0.1"),
        nbformat.v4.new_code_cell("%gpu_status --stop"),
    ])
    shown = shown_first(execute(notebook), 1)
    assert shown["data"]["text/plain"] == (f"Live GPU monitor (replay of {recording.name}); %gpu_status --stop "
                                           f"leaves its summary and chart")
    assert shown["data"][WIDGET_VIEW]["model_id"]  # the widget, where it can be drawn
    assert notebook.cells[1].outputs[0].data["text/plain"].startswith(f"Live GPU monitor (replay of {recording.name}): "
                                                                      f"stopped at ")
