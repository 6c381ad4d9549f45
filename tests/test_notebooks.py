"""The teaching notebooks run top to bottom in a real Jupyter kernel and show what they teach.

Each notebook in notebooks/ is executed once (nbclient, a fresh kernel started in notebooks/,
as a student's would be), on this machine without a GPU. A cell may fail only where the error
is the lesson (tag ``raises-exception``), and there it must really show that error; every
other cell must run without an error or anything on stderr. Then each notebook is checked for
the outputs its text talks about.
"""
from __future__ import annotations

import copy
import json
import os
import re

import pytest

from conftest import ROOT
from kernel import bundles, execute, run_cells, stream

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

pytestmark = pytest.mark.kernel

NOTEBOOKS = ROOT / "notebooks"
NAMES = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds; each notebook takes well under a minute in all
RAISES = "raises-exception"
SIZE = re.compile(r"([\d.]+) (B|KiB|MiB|GiB)")
UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


@pytest.fixture(scope="module")
def executed():
    """name -> the notebook executed in a fresh kernel, each run once per test session."""
    cache = {}

    def run(name: str):
        if name not in cache:
            notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
            with pytest.MonkeyPatch.context() as patch:
                # The kernel inherits this process's environment; a student's starts without
                # torch settings (PYTORCH_CUDA_ALLOC_CONF ...) that other tests may leave here.
                for variable in [variable for variable in os.environ if variable.startswith("PYTORCH_")]:
                    patch.delenv(variable)
                cache[name] = execute(notebook, cwd=NOTEBOOKS, timeout=CELL_TIMEOUT)
        return cache[name]

    return run


def code_cell(notebook, start: str, exact: bool = False):
    """The one code cell whose source starts with ``start`` (is ``start`` if ``exact``)."""
    found = [cell for cell in notebook.cells if cell.cell_type == "code"
             and (cell.source == start if exact else cell.source.startswith(start))]
    assert len(found) == 1, f"{len(found)} cells start with {start!r}"
    return found[0]


def shown(cell, mime: str = "text/plain") -> str:
    """What a reader sees of the cell: its printed text and its displayed ``mime`` parts."""
    return stream(cell) + stream(cell, "stderr") + "".join(bundle.get(mime, "") for bundle in bundles(cell))


def largest_size(text: str) -> int:
    """The largest size written in ``text`` ("128 MiB", "1.07 GiB"), in bytes."""
    return max((int(float(value) * UNITS[unit]) for value, unit in SIZE.findall(text)), default=0)


def test_the_notebooks_are_there():
    assert NAMES == ["01-gpu-status.ipynb", "02-alloc-conf.ipynb", "03-clear-cache.ipynb",
                     "04-find-batch.ipynb", "05-out-of-memory.ipynb", "06-multi-gpu.ipynb"]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_stored_clean_and_installable_anywhere(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code), "outputs stored"
    # Users install the package without tests/: nothing may come from there.
    assert not any("tests/" in cell.source for cell in notebook.cells)
    # How to install on Colab is explained at the top, and never executed (the test must not pip).
    top = " ".join(cell.source for cell in notebook.cells[:2] if cell.cell_type == "markdown")
    assert "Colab" in top and "pip install" in top
    assert not any("pip install" in cell.source for cell in code)


@pytest.mark.parametrize("name", NAMES)
def test_an_editable_install_is_followed_by_a_kernel_restart(name):
    """`%pip install -e ..` writes a .pth file, which Python reads only at start-up: the kernel
    that ran it then fails `%load_ext colab_gpu` with "No module named 'colab_gpu'" until it is
    restarted (checked by hand in a fresh venv). The notebook must say so where it says to run it."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    top = " ".join(cell.source for cell in notebook.cells[:2] if cell.cell_type == "markdown")
    editable = re.search(r"pip install -q -e \.\.(.*?)(\n- |\n\n|$)", top, re.S)
    assert editable, "the notebook no longer says how to install from a checkout"
    assert "restart the kernel" in " ".join(editable.group(1).split()), editable.group(0)


@pytest.mark.parametrize("name", NAMES)
def test_a_notebook_promises_your_real_gpu_only_where_a_cell_reads_it(name):
    """02 told a student to pick a T4 runtime because "the same cells show your real GPU", but none
    of its cells reads a GPU or starts CUDA (its settings belong before that): on the T4 it showed
    what it shows without one."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    top = " ".join(" ".join(cell.source.split()) for cell in notebook.cells[:2] if cell.cell_type == "markdown")
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    if "show your real GPU" in top:
        assert "%gpu_status" in code or '"cuda" if torch.cuda.is_available()' in code, top


def test_04_promises_no_memory_fit_its_model_cannot_give_on_a_t4():
    """04 told a T4 student the search there "predicts the limit from measured memory", but its
    model's step at --max 4096 grows memory by a few tens of MiB, under the growth a fit needs
    on a T4 (its noise floor): there too the search strides 8x to --max, with no fit."""
    from colab_gpu.batch.search import noise_floor

    notebook = nbformat.read(NOTEBOOKS / "04-find-batch.ipynb", as_version=4)
    assert code_cell(notebook, "%%find_batch --var batch_size --max 4096 ")
    images, hidden = 4096 * 28 * 28 * 4, 4096 * 256 * 4  # float32 input, one hidden layer's output
    assert images + 4 * hidden < noise_floor(int(14.56 * 2 ** 30))  # + ReLU's, and both gradients
    top = " ".join(" ".join(cell.source.split()) for cell in notebook.cells[:2] if cell.cell_type == "markdown")
    assert "predicts the limit from measured memory" not in top and "no memory fit" in top


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom_without_unexpected_errors(executed, name):
    notebook = executed(name)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        errors = [output for output in cell.outputs if output.output_type == "error"]
        stderr = stream(cell, "stderr")
        where = f"{name} cell {index}: {cell.source[:60]!r}"
        if RAISES in cell.metadata.get("tags", []):
            # The error is the lesson: it must really be shown (a magic's UsageError is printed).
            assert errors or stderr.startswith("UsageError: "), f"{where}: the expected error is missing"
        else:
            assert not errors, f"{where}: {errors[0].ename}: {errors[0].evalue}"
            assert stderr == "", f"{where} wrote to stderr: {stderr}"


def test_01_gpu_status_shows_this_machine_the_recordings_and_the_live_run(executed):
    notebook = executed("01-gpu-status.ipynb")
    mine = code_cell(notebook, "%gpu_status", exact=True)
    text = shown(mine)
    assert re.search(r"No NVIDIA GPU found|^GPU \d+ ", text, re.M), text
    # What the text says of a machine without a GPU: the reason on the card's "No GPU read:" line.
    assert re.search(r"^GPU \d+ ", text, re.M) or "\nNo GPU read: " in text, text
    assert "cgpu-card" in shown(mine, "text/html")  # the HTML card a notebook shows

    t4 = code_cell(notebook, "%gpu_status --from \"$T4\"")
    assert "Tesla T4  (cuda:0, compute capability 7.5)" in shown(t4)
    assert "388 MiB reserved by the driver" in shown(t4)
    assert "torch.float16" in shown(t4)  # the T4 advice the text explains
    assert "Tesla T4" in shown(t4, "text/html")
    v100 = shown(code_cell(notebook, "%gpu_status --from \"$V100_TRACE\""))
    assert "Tesla V100S-PCIE-32GB" in v100
    # What the text says of a CSV log: rows it has nothing for left out, missing fields n/a.
    assert "n/a" in v100 and not re.search(r"^  (clocks|PCIe|process)", v100, re.M)

    data = json.loads(stream(code_cell(notebook, "%gpu_status --json")))
    # the same status as the card (its advice folded to 80 columns in the text)
    assert [advice["message"] for advice in data["advice"]][0] in " ".join(text.split())

    api = stream(code_cell(notebook, "status = colab_gpu.status()"))
    assert api.startswith("<Status ")
    recorded = stream(code_cell(notebook, "t4 = colab_gpu.status(path=T4)"))
    assert "Tesla T4 compute capability (7, 5)" in recorded and "of 15.00 GiB used" in recorded

    # The live widget, turned by --stop into its last state (HTML and a PNG): a notebook handed
    # out executed showed "Error displaying widget: model not found" there when reopened.
    (live,) = bundles(code_cell(notebook, "%gpu_status --live --demo"))
    assert sorted(live) == ["image/png", "text/html", "text/plain"]
    assert re.match(r"Live GPU monitor \(replay of nanogpt-8gpu-training_gpus0-3\.csv\): stopped at ", live["text/plain"])
    assert f"src='data:image/png;base64,{live['image/png']}'" in live["text/html"]
    stop = bundles(code_cell(notebook, "%gpu_status --stop"))[0]
    summary = re.match(r"Live monitor stopped: (\d+) samples", stop["text/plain"])
    assert summary and int(summary.group(1)) >= 5, stop["text/plain"]
    assert "data:image/png;base64," in stop["text/html"]  # the chart that stays in the notebook
    samples = stream(code_cell(notebook, "samples = colab_gpu.history(frame=False)"))
    assert samples.startswith(f"{summary.group(1)} samples")  # history() holds what was shown


@pytest.mark.parametrize("name", NAMES)
def test_an_executed_notebook_renders_as_html_without_a_kernel(executed, name):
    """Teachers hand out executed notebooks; GitHub, Colab's viewer and nbconvert draw their
    saved outputs with no kernel. A widget's view needs one (or its saved state): JupyterLab
    showed "Error displaying widget: model not found" where the live monitor had run."""
    nbconvert = pytest.importorskip("nbconvert", reason="nbconvert is not installed (the test extra has it)")
    notebook = executed(name)
    views = [mime for cell in notebook.cells if cell.cell_type == "code" for bundle in bundles(cell)
             for mime in bundle if "widget" in mime]
    assert views == []  # nothing saved that only a kernel can draw
    # nbconvert draws a widget's output as its text alone: the live monitor was one line there.
    html, _ = nbconvert.HTMLExporter().from_notebook_node(copy.deepcopy(notebook))
    assert "Error displaying widget" not in html and "model not found" not in html
    if name == "01-gpu-status.ipynb":  # the stopped monitor's chart, in its own cell and --stop's
        charts = re.findall(r"<img alt=.replay of nanogpt-8gpu-training_gpus0-3\.csv: chart of the samples kept. "
                            r"src=.data:image/png;base64,", html)  # its quotes as nbconvert writes them
        assert len(charts) == 2, len(charts)
        assert re.search(r"REPLAY of a recorded trace .*? stopped at \d\d:\d\d:\d\d by %gpu_status --stop", html, re.S)


def test_01_says_where_its_t4_recording_was_made():
    """The shipped T4 recording is an AWS server's (colab_gpu/data/README.md): driver 515 and a
    desktop (Xorg) process, which no Colab runtime has. The notebook and the README called it a
    Colab T4, so a student comparing it with their Colab card looked for a desktop that is not there."""
    assert "of an AWS Tesla T4" in (ROOT / "colab_gpu" / "data" / "README.md").read_text()
    notebook = nbformat.read(NOTEBOOKS / "01-gpu-status.ipynb", as_version=4)
    text = " ".join(" ".join(cell.source.split()) for cell in notebook.cells if cell.cell_type == "markdown")
    assert "Colab Tesla T4" not in text and "recorded on an AWS server" in text
    assert "recorded Colab T4" not in (ROOT / "README.md").read_text()


def test_01_shows_the_recordings_where_the_package_lies_in_a_folder_with_a_space(tmp_path):
    """A student's checkout or venv under "C:\\Users\\First Last" or "~/ML projects": `--from $T4`
    put the path in unquoted, so the magic read two arguments and refused the second."""
    notebook = nbformat.read(NOTEBOOKS / "01-gpu-status.ipynb", as_version=4)
    spaced = tmp_path / "ML projects"
    spaced.mkdir()
    (spaced / "colab_gpu").symlink_to(ROOT / "colab_gpu")  # colab_gpu.__file__ then lies under it
    replays = [cell.source for cell in notebook.cells if cell.source.startswith("%gpu_status --from")]
    cells = [f"import sys; sys.path.insert(0, {str(spaced)!r})",
             code_cell(notebook, "%load_ext colab_gpu").source, code_cell(notebook, "import pathlib").source,
             "print(colab_gpu.__file__)", *replays]
    ran = run_cells(cells, timeout=CELL_TIMEOUT)
    assert "ML projects" in stream(ran.cells[3])  # the notebook's recordings are under it
    t4, v100 = ran.cells[4:]
    assert stream(t4, "stderr") == stream(v100, "stderr") == ""
    assert "Tesla T4  (cuda:0" in shown(t4) and "Tesla V100S-PCIE-32GB" in shown(v100)


def test_02_alloc_conf_checks_refuses_and_applies(executed):
    notebook = executed("02-alloc-conf.ipynb")
    assert "torch not imported yet" in shown(code_cell(notebook, "%alloc_conf", exact=True))
    checked = shown(code_cell(notebook, "%alloc_conf --check expandable"))
    assert "expandable_segments = True" in checked and "max_split_size_mb = 128" in checked
    assert "max_split_size_mb with expandable_segments" in checked  # the warning the text explains
    assert "PYTORCH_CUDA_ALLOC_CONF not set" in checked  # --check applied nothing

    typo = stream(code_cell(notebook, "%alloc_conf --check expandible"), "stderr")
    assert "did you mean 'expandable_segments'" in typo
    assert "out of range" in stream(code_cell(notebook, "%alloc_conf garbage_collection_threshold"), "stderr")
    refused = stream(code_cell(notebook, "import os"))
    assert refused.startswith("refused: max_split_size_mb=lots")
    assert "PYTORCH_CUDA_ALLOC_CONF is None" in refused  # a refused setting changed nothing

    assert "--preset fragmentation:  expandable_segments:True" in stream(
        code_cell(notebook, "from colab_gpu.allocator import PRESETS"))
    applied = shown(code_cell(notebook, "%alloc_conf --preset fragmentation"))
    assert "PYTORCH_CUDA_ALLOC_CONF = 'expandable_segments:True'" in applied
    merged = shown(code_cell(notebook, "%alloc_conf roundup_power2_divisions=4"))
    assert "'expandable_segments:True,roundup_power2_divisions:4'" in merged
    assert "backend cannot change now" in stream(code_cell(notebook, "%alloc_conf --preset async"), "stderr")
    assert "(not in torch 2." in stream(code_cell(notebook, "%alloc_conf --keys"))
    assert "nothing set: torch uses its defaults" in shown(code_cell(notebook, "%alloc_conf --reset"))


def test_03_clear_cache_frees_what_the_failed_cell_and_the_history_held(executed):
    notebook = executed("03-clear-cache.ipynb")
    failed = code_cell(notebook, "train_step()")
    assert [output.ename for output in failed.outputs if output.output_type == "error"] == ["RuntimeError"]

    holders = shown(code_cell(notebook, "%clear_cache --vars"))
    variables, elsewhere = holders.split("Held by none of your variables")
    assert "weights" in variables and largest_size(variables) < 128 * 2 ** 20
    assert re.search(r"^  the last error +\S+ 128 MiB in 1 tensor", elsewhere, re.M), holders

    report = shown(code_cell(notebook, "%clear_cache", exact=True))
    first_line = report.splitlines()[0]
    assert first_line.startswith("clear_cache: freed ")
    assert largest_size(first_line.split(";")[0]) >= 128 * 2 ** 20  # the failed step's activations
    assert "weights" in report  # still there: never deleted unless named

    history = stream(code_cell(notebook, "%clear_cache --quiet"))
    assert largest_size(history.split(";")[0]) >= 16 * 2 ** 20  # the tensor Out[...] held

    assert "deleted weights" in shown(code_cell(notebook, "%clear_cache weights"))
    assert stream(code_cell(notebook, 'print("weights" in globals())')) == "False\n"

    ranking = shown(code_cell(notebook, "model = torch.nn.Linear"))
    assert ranking.index("optimizer") < ranking.index("model ")  # Adam's state outweighs the model
    # What the text says of the ranking: weights and gradients, then Adam's own two states
    # (a row folded at 80 columns continues under its value).
    unfolded = re.sub(r"\n {19}", " ", ranking)
    assert re.search(r"^  model +32 MiB .*all shared with other variables", unfolded, re.M), ranking
    assert re.search(r"^  optimizer +64 MiB .*32 MiB held by it alone", unfolded, re.M), ranking
    freed = re.search(r"([\d,]+) bytes freed", stream(code_cell(notebook, "report = colab_gpu.clear_cache")))
    assert freed and int(freed.group(1).replace(",", "")) >= 64 * 2 ** 20


def test_04_find_batch_sets_a_size_that_ran_and_leaves_the_model(executed):
    notebook = executed("04-find-batch.ipynb")
    search = code_cell(notebook, "%%find_batch --var batch_size")
    html = shown(search, "text/html")
    answer = re.search(r"<h4>batch_size = (\d+) \(largest fitting", html)
    assert answer, html[:500]
    assert "<img alt='peak memory and throughput" in html  # the chart, inside the report
    after = stream(code_cell(notebook, 'print("batch_size ='))
    assert f"batch_size = {answer.group(1)}\n" in after  # the variable holds the answer shown
    assert 2 <= int(answer.group(1)) <= 4096
    # The text explains the CPU run's sizes: 8x strides while memory barely grows, then --max.
    assert [int(size) for size in re.findall(r"<tr(?: class='cgpu-answer')?><td>(\d+)</td>", html)] == \
        [2, 16, 128, 1024, 4096]
    assert "model unchanged by the search: True" in after

    assert re.search(r"<h4>batch_size = \d+ \(fastest", shown(code_cell(notebook, "%%find_batch --mode throughput"),
                                                            "text/html"))
    api = stream(code_cell(notebook, "def evaluate(size)"))
    found = re.search(r"answer: (\d+) \| trials: \[([\d, ]+)\]", api)
    assert api.startswith("<BatchResult batch_size = ") and found
    assert int(found.group(1)) in [int(size) for size in found.group(2).split(", ")]  # a size that ran

    oom = stream(code_cell(notebook, "try:\n    torch.empty(2**60"))
    assert "out of memory? True" in oom and "wrapped, out of memory? True" in oom
    assert "a shape error, out of memory? False" in oom


def card(cell) -> str:
    """The out-of-memory card under a failed cell (its text, rows unfolded), after the traceback."""
    assert [output.output_type for output in cell.outputs][0] == "error"
    (found,) = [bundle for bundle in bundles(cell) if bundle.get("text/plain", "").startswith("Out of memory on ")]
    assert "cgpu-card" in found["text/html"]
    return " ".join(found["text/plain"].split())


def test_05_out_of_memory_shows_each_card_and_its_fix_works(executed):
    notebook = executed("05-out-of-memory.ipynb")
    kept = card(code_cell(notebook, "train_step()", exact=True))
    assert "the failing call asked for 8.00 GiB" in kept
    assert "IPython keeps 256 MiB of tensors that no variable of yours holds: the last error's traceback 256 MiB" in kept
    assert stream(code_cell(notebook, "%clear_cache --quiet", exact=True)).startswith("clear_cache: freed cpu tensors 256 MiB")

    leak = card(code_cell(notebook, "batch = torch.randn(128 * 1024, 1024"))
    # five 64 MiB inputs and five relu outputs, the last step's shared with `loss`: 4 x 128 MiB
    assert "`total` keeps the autograd graphs of 5 steps" in leak and "512 MiB of tensors saved for backward()" in leak
    assert "fix: `%clear_cache total` frees it now; then add numbers, not tensors: `total += loss.item()`" in leak
    fixed = stream(code_cell(notebook, "%clear_cache total --quiet"))
    assert fixed.startswith("clear_cache: freed cpu tensors 512 MiB; deleted total") and "batch of 512 MiB" in fixed

    too_large = card(code_cell(notebook, "batch_size = 131072"))
    assert "the failing call asked for 1.50 GiB" in too_large and "[nothing else can make room]" in too_large
    assert "fix: `%%find_batch --var batch_size` as the cell's first line" in too_large
    found = re.match(r"batch_size = (\d+): ", stream(code_cell(notebook, 'print(f"batch_size =')))
    assert found and 1024 <= int(found.group(1)) < 131072 * 2 // 3  # it fits in the 1 GiB, with the rest

    pasted = " ".join(shown(code_cell(notebook, "%explain_oom ")).split())
    assert "from pasted message, PyTorch 2.1" in pasted and "the cache is fragmented" in pasted
    assert "fix: `%alloc_conf expandable_segments=True` right after `%load_ext colab_gpu`" in pasted
    api = stream(code_cell(notebook, "report = colab_gpu.explain_oom("))
    assert api.startswith(f"{round(1.70 * 2 ** 30)} {round(2.30 * 2 ** 30)} None\nfragmentation ")


def test_06_multi_gpu_runs_two_ranks_and_shows_what_its_text_says(executed):
    """On this machine without a GPU: two Gloo ranks on the CPU, said so; the numbers the text
    works out by hand; DDP's weights equal everywhere; the failing rank's traceback; DataParallel
    skipped, with the reason."""
    notebook = executed("06-multi-gpu.ipynb")
    plan = stream(code_cell(notebook, "if gpus >= 2:\n    nprocs, backend"))
    assert plan.startswith("0 GPUs here: the ranks run on the CPU with Gloo") and plan.endswith("2 ranks, backend gloo\n")
    hello = code_cell(notebook, "def hello():")
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} of 2 on cpu: my value is {rank + 1.0}\n" in stream(hello)
        assert f"[rank {rank}] rank {rank}: after all_reduce 3.0\n" in stream(hello)
    assert bundles(hello)[0]["text/plain"] == "[3.0, 3.0]"

    gradients = stream(code_cell(notebook, "x = torch.arange(1.0, 9.0)"))
    assert "[rank 0] rank 0: x = [1.0, 2.0, 3.0, 4.0], loss 30.0, gradient -30.0\n" in gradients
    assert "[rank 1] rank 1: x = [5.0, 6.0, 7.0, 8.0], loss 174.0, gradient -174.0\n" in gradients
    assert gradients.endswith("averaged on the ranks: [-102.0, -102.0] | whole batch, one process: -102.0\n")

    trained = stream(code_cell(notebook, "torch.manual_seed(0)\ninputs = torch.randn(256, 10)"))
    assert all(f"[rank {rank}] rank {rank}, epoch {epoch}: 128 samples, last loss " in trained
               for rank in (0, 1) for epoch in range(3))
    assert stream(code_cell(notebook, 'print("equal on every rank:"')) == (
        "equal on every rank: True\nequal to one process on the whole batch: True\n")

    magic = code_cell(notebook, "%%distributed -n $nprocs --backend $backend")
    assert "[rank 1] rank 1 sees the notebook's dataset (256 samples) and model (1, 10)\n" in stream(magic)
    assert bundles(magic)[0]["text/plain"] == "[0, 10]"

    (error,) = [output for output in code_cell(notebook, "def fragile():").outputs if output.output_type == "error"]
    assert (error.ename, error.evalue) == ("RankError", "rank 1 of 2 failed: ValueError: rank 1 found a bad batch; "
                                                        "rank 0 did not finish")
    assert 'raise ValueError("rank 1 found a bad batch")' in "\n".join(error.traceback)
    assert stream(code_cell(notebook, "if gpus >= 2:\n    parallel")) == (
        "skipped: DataParallel needs two GPUs, and this machine has 0\n")
