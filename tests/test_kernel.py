"""The magics in a real Jupyter kernel: what a notebook front end receives."""
from __future__ import annotations

import html
import json

import pytest

from conftest import DATA
from kernel import bundles, run_cells, stream

pytestmark = pytest.mark.kernel

T4 = DATA / "nvidia-smi-xml" / "tesla-t4.xml"


@pytest.fixture(scope="module")
def notebook():
    """One kernel session: load the extension, show a recording, then the live status after torch."""
    return run_cells([
        "%load_ext colab_gpu",
        f"%gpu_status --from {T4}",
        # What the card must hold, computed by the same API in the same kernel.
        "import json, colab_gpu\n"
        f"print(json.dumps([a.message for a in colab_gpu.status(path={str(T4)!r}).advice]))",
        "import torch\n%gpu_status\nprint('cuda initialized:', torch.cuda.is_initialized())",
    ])


def test_gpu_status_from_a_recording_is_an_html_card_with_a_text_twin(notebook):
    (bundle,) = bundles(notebook.cells[1])
    card, text = bundle["text/html"], bundle["text/plain"]
    assert '<div class="cgpu-card">' in card and ".cgpu-card{" in card  # the themed card and its CSS
    assert "Tesla T4" in card and "replay of tesla-t4.xml" in card
    assert "15.00&nbsp;GiB" in card  # memory total, 15360 MiB, never broken from its unit
    advice = json.loads(stream(notebook.cells[2]))
    assert advice  # at least one rule applies to the recording
    for message in advice:
        assert f"{html.escape(message)}</li>" in card.replace("&nbsp;", " ")
    assert text.splitlines()[1:3] == ["Source: replay of tesla-t4.xml", "Driver 515.105.01, CUDA driver 11.7"]
    assert "GPU 0  Tesla T4" in text and "Traceback" not in text


def test_the_html_card_names_the_gpus_uuid_as_its_text_twin_does(notebook):
    """CUDA_VISIBLE_DEVICES takes a GPU's UUID, and the advice says to list one; a notebook
    shows the HTML card, which gave each MIG instance's UUID but not the GPU's own."""
    (bundle,) = bundles(notebook.cells[1])
    uuid = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert f"uuid        {uuid}" in bundle["text/plain"]
    assert f"<td class='cgpu-muted cgpu-label'>uuid</td><td>{uuid}</td>" in bundle["text/html"]


def test_live_gpu_status_after_import_torch_leaves_cuda_uninitialized(notebook):
    cell = notebook.cells[3]
    assert stream(cell).strip().endswith("cuda initialized: False")
    (bundle,) = bundles(cell)
    assert "torch 2." in bundle["text/plain"] and "CUDA not initialized" in bundle["text/plain"]
    assert '<div class="cgpu-card">' in bundle["text/html"]
    assert not any(output.output_type == "error" for output in cell.outputs)
