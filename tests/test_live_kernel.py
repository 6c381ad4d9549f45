"""The live widget through a real Jupyter kernel (nbclient), in both environments.

What a front end receives: the widget is displayed, the sampler thread's updates reach the
front end as widget state while other cells run, and --stop (or %reload_ext, which stops the
monitor) leaves a PNG chart in the notebook's saved output.
"""
from __future__ import annotations

import re

import pytest

from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.kernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_widget_updates_reach_the_front_end_and_stop_leaves_a_chart(monkeypatch):
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
    client = nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3",
                                     store_widget_state=True)
    client.execute()
    live_output = notebook.cells[1].outputs
    assert [o.output_type for o in live_output] == ["display_data"]
    model_id = live_output[0].data[WIDGET_VIEW]["model_id"]
    # Where the widget cannot be drawn (the saved notebook on GitHub), its text names it, not its CSS.
    assert live_output[0].data["text/plain"] == ("Live GPU monitor (replay of v100s-pcie-32gb_miris.csv); "
                                                 "%gpu_status --stop leaves its summary and chart")
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"][model_id]["state"]
    # The last value the front end received came from the sampler thread after --stop.
    assert "REPLAY of a recorded trace" in state["value"]
    samples = int(re.search(r"stopped at \d\d:\d\d:\d\d by %gpu_status --stop, (\d+) samples",
                            state["value"])[1])
    assert samples >= 20  # about 2.5 s at 0.1 s, the shortest interval
    assert notebook.cells[2].outputs == []  # nothing printed into the other cell
    stop_output = notebook.cells[3].outputs[0]
    assert "Live monitor stopped" in stop_output.data["text/plain"]
    assert "data:image/png;base64," in stop_output.data["text/html"]
    # %reload_ext stopped the second run: its cell shows what --stop would have shown
    reload_output = notebook.cells[6].outputs
    assert [o.output_type for o in reload_output] == ["display_data"]
    assert reload_output[0].data["text/plain"].startswith("Live monitor stopped: ")
    assert "data:image/png;base64," in reload_output[0].data["text/html"]


def test_the_saved_widget_text_of_a_long_recording_name_keeps_the_stop_hint(monkeypatch, tmp_path):
    """ipywidgets (7 and 8) cut a widget's text/plain at 110 characters: a notebook saved
    without its widget state showed "...; %gpu_status --stop leaves its summary and…" or, for
    a longer file name, lost the hint how to stop the monitor."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    recording = tmp_path / "resnet50-finetune-a100-lr3e-4-warmup-run3.csv"
    recording.write_bytes((ROOT / "tests" / "data" / "nvidia-smi-csv" / "v100s-pcie-32gb_miris.csv").read_bytes())
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext colab_gpu"),
        nbformat.v4.new_code_cell(f"%gpu_status --live --from {recording} --interval 0.1"),
        nbformat.v4.new_code_cell("%gpu_status --stop"),
    ])
    nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3").execute()
    (shown,) = notebook.cells[1].outputs
    assert shown.data["text/plain"] == (f"Live GPU monitor (replay of {recording.name}); %gpu_status --stop "
                                        f"leaves its summary and chart")
    assert shown.data[WIDGET_VIEW]["model_id"]  # still the widget where it can be drawn
