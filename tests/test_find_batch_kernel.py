"""%%find_batch in a real Jupyter kernel (ipykernel through nbclient), a real torch model on the CPU.

What the notebook front end receives: one progress table, shown once and then updated in
place through its display id after every trial, which ends as the final report (HTML and
plain text) with the chart inside; and the answer in the kernel's variable.
"""
from __future__ import annotations

import base64
import re

import pytest

from kernel import bundles, execute as kernel_execute, run_cells, stream

pytest.importorskip("nbclient")

pytestmark = pytest.mark.kernel

SETUP = """%load_ext colab_gpu
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
SEARCH = """%%find_batch --var batch_size --max 256
x = torch.randn(batch_size, 64)
loss = model(x).logsumexp(dim=1).mean()
loss.backward(); opt.step(); opt.zero_grad()
"""
CHECK = "print('batch_size', batch_size)"


def test_the_table_updates_in_place_and_ends_as_the_report_with_its_chart():
    messages = []
    notebook = run_cells([SETUP, SEARCH, CHECK], timeout=60, messages=messages)
    shown = [(kind, content) for cell, kind, content in messages
             if cell == 1 and kind in ("display_data", "update_display_data", "execute_result", "stream")]
    kinds = [kind for kind, _ in shown]
    # The table first, then its updates, the last one the report: nothing printed, nothing returned.
    assert kinds[0] == "display_data", kinds
    updates = kinds[1:]
    assert updates and set(updates) == {"update_display_data"}, kinds
    table_id = shown[0][1]["transient"]["display_id"]
    assert all(content["transient"]["display_id"] == table_id for _, content in shown[1:])

    # The saved notebook: exactly one output, the final report with the chart inside it.
    (report_bundle,) = bundles(notebook.cells[1])
    report = report_bundle["text/plain"]
    answer = int(re.search(r"batch_size = (\d+) \(largest fitting", report).group(1))
    html = report_bundle["text/html"]
    assert "<table>" in html and f"batch_size = {answer}" in html
    trial_rows = report.count(" fits ")
    assert trial_rows >= 3 and len(updates) == trial_rows  # one update per trial after the first, one final
    assert "reached --max 256" in report
    chart = re.search(r"src='data:image/png;base64,([^']+)'", html).group(1)
    assert base64.b64decode(chart).startswith(b"\x89PNG")
    assert stream(notebook.cells[1]) == ""

    # The kernel's variable holds the answer: the largest size tried, since everything fits.
    assert answer == 256 and stream(notebook.cells[2]).strip() == f"batch_size {answer}"
    # While it ran, the table said so, without a chart; it never claimed to have stopped.
    first = shown[0][1]["data"]
    assert first["text/plain"].startswith("searching batch_size: 2 fits so far (1 trial, 0 out of memory)")
    assert "stopped" not in first["text/plain"] and "<img" not in first["text/html"]


def test_dash_o_returns_the_result_as_the_cells_out_and_shows_the_report_once():
    notebook = run_cells([SETUP, SEARCH.replace("--max 256", "--max 64 -o"),
                          "print(type(_).__name__, _.answer, _.answer == batch_size)"], timeout=60)
    outputs = notebook.cells[1].outputs
    returned = [output for output in outputs if output.output_type == "execute_result"]
    assert len(returned) == 1 and returned[0].data["text/plain"].startswith("batch_size = 64 (largest fitting")
    assert "data:image/png;base64," in returned[0].data["text/html"]
    # The progress table is emptied, not left as a second copy of the report.
    tables = [bundle for bundle in bundles(notebook.cells[1]) if bundle is not returned[0].data]
    assert all(bundle.get("text/plain", "") == "" and "text/html" not in bundle for bundle in tables), tables
    assert stream(notebook.cells[2]).strip() == "BatchResult 64 True"


def test_dash_o_with_output_text_makes_the_cells_out_plain_text_and_underscore_the_result():
    notebook = run_cells([SETUP + "%config GPUMagics.output = 'text'",
                          SEARCH.replace("--max 256", "--max 64 -o"),
                          "from colab_gpu.batch.result import BatchResult\n"
                          "print(isinstance(_, BatchResult), _.answer, len(_.trials) > 2)"], timeout=60)
    (returned,) = [output for output in notebook.cells[1].outputs if output.output_type == "execute_result"]
    assert set(returned.data) == {"text/plain"}, set(returned.data)
    assert returned.data["text/plain"].startswith("batch_size = 64 (largest fitting")
    # Text all through: the progress came as lines, no HTML table anywhere in the cell.
    assert not [bundle for bundle in bundles(notebook.cells[1]) if "text/html" in bundle]
    assert "trial  1: batch_size=" in stream(notebook.cells[1])
    assert stream(notebook.cells[2]).strip() == "True 64 True"


RESTORED_UNDER_CTRL_C = """import os, signal
class Ctrl_C_while_restored:
    restores = 0
    def state_dict(self): return {}
    def load_state_dict(self, saved):
        self.restores += 1
        if self.restores == 2:  # between trials: what ipykernel's interrupt sends
            os.kill(os.getpid(), signal.SIGINT)
state = Ctrl_C_while_restored()
"""
FAILING = """%%find_batch --max 64
x = torch.randn(batch_size, 64)
raise ValueError("my bug")
"""


def test_ctrl_c_between_trials_and_the_users_error_end_as_reports():
    import nbformat

    cells = [SETUP, RESTORED_UNDER_CTRL_C, "%%find_batch --restore state\nx = torch.randn(batch_size, 64)",
             CHECK, FAILING, FAILING.replace("raise", "if batch_size > 8: raise"), CHECK]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    for cell in notebook.cells[4:6]:
        cell.metadata["tags"] = ["raises-exception"]
    run = kernel_execute(notebook, timeout=60)

    interrupted = bundles(run.cells[2])[0]["text/plain"]
    assert interrupted.startswith("batch_size = 16 (largest fitting on cpu, 2 trials"), interrupted
    assert "stopped: interrupted (Ctrl-C)" in interrupted
    assert not [output for output in run.cells[2].outputs if output.output_type == "error"]
    assert stream(run.cells[3]).strip() == "batch_size 16"

    failed = run.cells[4]
    assert bundles(failed)[0]["text/plain"].startswith(
        "no batch_size found: batch_size=2 raised ValueError: my bug")
    error, = [output for output in failed.outputs if output.output_type == "error"]
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
    assert error.ename == "ValueError" and 'raise ValueError("my bug")' in traceback
    assert "search_batch" not in traceback and "run_trial" not in traceback
    # The user's line is labelled with the cell's own number ("Cell In[5], line 3"; "Input In
    # [5]" on IPython 8.0; 7.x names a file), never the next cell's: IPython 9.8+ counts
    # execution_count up before the cell runs.
    assert set(re.findall(r"In ?\[(\d+)\]", traceback)) <= {str(failed.execution_count)}, traceback

    # The error after sizes fitted: the variable keeps its value (16, from the interrupted
    # search), and the report said "batch_size = 2 (largest fitting on cpu, ...)" over the traceback.
    later = bundles(run.cells[5])[0]["text/plain"]
    assert later.startswith("no batch_size found: batch_size=16 raised ValueError: my bug"), later
    assert "largest that ran: 2" in later  # still said, as a fact
    assert stream(run.cells[6]).strip() == "batch_size 16"


def test_dash_o_with_the_users_error_keeps_the_report_above_the_traceback():
    import nbformat

    cells = [SETUP, FAILING.replace("--max 64", "--max 64 -o")]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    notebook.cells[-1].metadata["tags"] = ["raises-exception"]
    failed = kernel_execute(notebook, timeout=60).cells[1]
    # Nothing is returned, so the progress table is the only place the report can stay.
    assert [output.output_type for output in failed.outputs] == ["display_data", "error"]
    assert bundles(failed)[0]["text/plain"].startswith(
        "no batch_size found: batch_size=2 raised ValueError: my bug")


def test_the_api_as_a_cells_last_expression_shows_its_report_once():
    step = "lambda size: model(torch.randn(size, 64)).sum().backward()"
    notebook = run_cells([SETUP, f"import colab_gpu\ncolab_gpu.find_batch({step}, max=8)",
                          f"result = colab_gpu.find_batch({step}, max=8)"], timeout=60)
    reports = [bundle for bundle in bundles(notebook.cells[1]) if bundle.get("text/plain")]
    # The cell's Out is the report; the progress display that became the same report is emptied.
    assert [bundle["text/plain"].split(" (")[0] for bundle in reports] == ["batch_size = 8"]
    assert notebook.cells[1].outputs[-1].output_type == "execute_result"
    # Assigned, nothing is returned: the progress display stays the report.
    (kept,) = bundles(notebook.cells[2])
    assert kept["text/plain"].startswith("batch_size = 8 (largest fitting") and "<img" in kept["text/html"]


def test_an_import_error_of_the_cell_is_its_own_error_not_a_missing_package():
    import nbformat

    cells = [SETUP, "%%find_batch --max 16\nx = torch.randn(batch_size, 64)\nfrom torch import no_such_name",
             "print('ran on')"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    notebook.cells[1].metadata["tags"] = ["raises-exception"]
    failed = kernel_execute(notebook, timeout=60).cells[1]
    # The cell fails with its own error and line, as any cell would: Run All stops there, and
    # nothing tells the user to pip install the torch they already have.
    error, = [output for output in failed.outputs if output.output_type == "error"]
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
    assert error.ename == "ImportError" and "from torch import no_such_name" in traceback
    assert "pip install" not in stream(failed, "stderr")
    assert bundles(failed)[0]["text/plain"].startswith("no batch_size found: batch_size=2 raised ImportError")


CTRL_C_WHILE_THE_CHART_IS_DRAWN = """import os, signal, sys
class Ctrl_C_on_importing_matplotlib:  # the chart's first drawing imports it: a second or so
    pressed = False
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" and not self.pressed:
            self.pressed = True
            os.kill(os.getpid(), signal.SIGINT)  # what ipykernel's interrupt sends
        return None
assert "matplotlib" not in sys.modules
ctrl_c = Ctrl_C_on_importing_matplotlib()
sys.meta_path.insert(0, ctrl_c)
batch_size = 7
"""


def test_ctrl_c_while_the_final_report_is_drawn_keeps_the_answer_and_the_report():
    notebook = run_cells([SETUP, CTRL_C_WHILE_THE_CHART_IS_DRAWN,
                          "%%find_batch --max 16\nx = torch.randn(batch_size, 64)",
                          "print('batch_size', batch_size, ctrl_c.pressed)"], timeout=60)
    # The search had ended: the Ctrl-C is no error, the table is not left "searching ...
    # still running", and the answer found is assigned, not the variable's old 7.
    searched = notebook.cells[2]
    assert not [output for output in searched.outputs if output.output_type == "error"]
    (report,) = bundles(searched)
    assert report["text/plain"].startswith("batch_size = 16 (largest fitting"), report["text/plain"]
    assert "data:image/png;base64," in report["text/html"]
    assert stream(notebook.cells[3]).strip() == "batch_size 16 True"


def test_a_cell_that_plots_shows_the_figure_of_its_first_run_only():
    notebook = run_cells([SETUP + "%matplotlib inline\nimport matplotlib.pyplot as plt\nruns = []",
                          "%%find_batch --max 16\nx = torch.randn(batch_size, 64)\n"
                          "plt.figure(); plt.plot(x[:, 0]); runs.append(batch_size)", "print(len(runs))"],
                         timeout=60)
    searched = notebook.cells[1]
    figures = [bundle for bundle in bundles(searched) if "image/png" in bundle and "text/html" not in bundle]
    # Each run opened a figure (six; more where a busy machine made a trial time its runs again):
    # one is the cell's output, as a print's would be, not six.
    assert len(figures) == 1, [bundle.get("text/plain") for bundle in bundles(searched)]
    runs = int(stream(notebook.cells[2]))
    assert runs >= 6 and f"{runs - 1} later runs had output too, hidden" in stream(searched, "stderr")


def test_ctrl_c_while_the_cells_out_draws_its_chart_is_held_until_it_is_drawn():
    # With -o the chart is first drawn by IPython's display hook, after the magic returned; here
    # Ctrl-C comes half-way through matplotlib's import, which it would leave broken.
    ctrl_c = CTRL_C_WHILE_THE_CHART_IS_DRAWN.replace('name == "matplotlib"', 'name == "matplotlib.colors"')
    cells = [SETUP, ctrl_c, "%%find_batch --max 16 -o\nx = torch.randn(batch_size, 64)",
             "import matplotlib.pyplot\nprint('batch_size', batch_size, ctrl_c.pressed, type(_).__name__)"]
    notebook = run_cells(cells, timeout=60)
    searched = notebook.cells[2]
    assert not [output for output in searched.outputs if output.output_type == "error"]
    (returned,) = [output.data for output in searched.outputs if output.output_type == "execute_result"]
    assert returned["text/plain"].startswith("batch_size = 16 (largest fitting"), returned["text/plain"]
    assert "data:image/png;base64," in returned["text/html"]
    assert stream(notebook.cells[3]).strip() == "batch_size 16 True BatchResult"


def test_a_plan_for_a_t4_in_a_kernel_without_a_gpu_sets_nothing_and_starts_no_cuda():
    """--plan in a real kernel: the cell's "cuda" model and tensors are fake there, the report
    is one PLANNED output, and neither the variable nor CUDA is touched."""
    plan = SEARCH.replace("%%find_batch --var batch_size --max 256",
                          "%%find_batch --plan T4 --max 4096").replace(
        "x = torch.randn(batch_size, 64)", "x = torch.randn(batch_size, 64, device='cuda')").replace(
        "model(x)", "model.to('cuda')(x)")
    check = "print('batch_size' in globals(), torch.cuda.is_initialized(), type(model[0].weight).__name__)"
    notebook = run_cells([SETUP, plan, check], timeout=60)
    (report_bundle,) = bundles(notebook.cells[1])
    assert report_bundle["text/plain"].startswith("PLANNED for T4: batch_size = 4096")
    assert "PLANNED for T4" in report_bundle["text/html"]
    assert stream(notebook.cells[2]) == "False False Parameter\n"
