"""The live monitor in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

Runs where the browser extra is installed (scripts/test.sh installs it in the "latest"
environment, and Chromium from Debian); elsewhere each test is skipped with the reason.
Screenshots are saved under test-artifacts/ for a person to look at.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the browser extra)")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (the browser extra)")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent: apt-get install chromium", allow_module_level=True)
# Ubuntu's apt package is a stub that asks for the snap, which does not run in a container.
_version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=60)
if _version.returncode != 0:
    pytest.skip(f"{CHROMIUM} does not run ({(_version.stderr or _version.stdout).strip()[:120]}): "
                f"install Chromium from Debian, not Ubuntu's snap stub", allow_module_level=True)

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium with a fresh profile (never one a tool downloads)."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 900})
        yield context
        context.close()


NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": "%load_ext colab_gpu"},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": "%gpu_status --live --demo --interval 0.25"},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 with a token, serving a folder with one notebook."""
    root = tmp_path_factory.mktemp("lab")
    (root / "live.ipynb").write_text(json.dumps(NOTEBOOK))
    port, token = free_port(), "colab-gpu-test-token"
    home = tmp_path_factory.mktemp("home")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(home), JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    log = open(root.parent / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.news_url=", "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True",
         "--JupyterNotebookApp.expose_app_in_browser=True", "--allow-root"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "JupyterLab did not start"
            time.sleep(0.3)
    yield base, token
    server.terminate()
    server.wait(timeout=30)
    log.close()


def theme(page, name: str) -> None:
    """Switch the page's JupyterLab to the theme ``name`` ("JupyterLab Light", "JupyterLab Dark")."""
    page.evaluate("name => window.jupyterapp.commands.execute('apputils:change-theme', {theme: name})", name)
    light = "true" if name == "JupyterLab Light" else "false"
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)
    page.wait_for_timeout(500)  # the theme's colours applied


def open_notebook(page, base: str, token: str, path: str, app: str = "lab") -> None:
    """Open ``path`` alone in ``page`` and wait for its kernel (the front end starts one):
    in JupyterLab (reset: no tab of an earlier page restored) or, with ``app="notebook"``, in
    Notebook 7 (served by the same server where the notebook package is installed)."""
    if app == "notebook":
        pytest.importorskip("notebook", reason="Notebook 7 is not installed (the browser extra)")
        page.goto(f"{base}/notebooks/{path}?token={token}")
    else:
        page.goto(f"{base}/lab/tree/{path}?token={token}&reset")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    wait_idle(page)


def wait_idle(page, timeout: int = 60_000) -> None:
    """Until the open notebook's kernel is idle, as its status shows (JupyterLab's status bar,
    Notebook 7's indicator: both read this)."""
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget?.sessionContext?.kernelDisplayStatus === 'idle'",
                           timeout=timeout)


def api(base: str, token: str, path: str, method: str = "GET", body=None):
    """A JupyterLab REST call; its JSON answer (None when empty)."""
    request = urllib.request.Request(f"{base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


# How readable the live chart's labels are where they are drawn: (text, size in px, contrast of
# their colour with what lies under them: WCAG's ratio, 4.5 is enough for small text). One
# call, so that the widget's redraw cannot swap the labels out in between.
LEGIBILITY = r"""panel => {
  const luminance = colour => {
    const [r, g, b] = colour.match(/[\d.]+/g).slice(0, 3).map(value => {
      value /= 255; return value <= 0.03928 ? value / 12.92 : ((value + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const under = element => {
    for (let node = element; node; node = node.parentElement) {
      const colour = getComputedStyle(node).backgroundColor;
      if (colour !== 'transparent' && !/rgba\(.*, 0\)$/.test(colour)) return colour;
    }
    return 'rgb(255, 255, 255)';
  };
  return [...panel.querySelectorAll('svg.cgpu-chart text')].map(label => {
    const style = getComputedStyle(label), [a, b] = [luminance(style.fill), luminance(under(label))];
    return [label.textContent, parseFloat(style.fontSize),
            Math.round(100 * (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)) / 100];
  });
}"""

# The right edge of each GPU row's busy number: a column that keeps its place has one.
NUMBER_EDGES = """panel => [...panel.querySelectorAll('tr')].slice(1).map(row => {
  const box = row.querySelector('.cgpu-num'); return box ? Math.round(box.getBoundingClientRect().right) : null; })"""


def on_panel(page, script: str):
    """``script`` run on the live panel as the page holds it now, in one step of the page's own
    JavaScript: the widget redraws its panel every 0.25 s, so a locator's two steps (find the
    element, then act on it) may act on one a redraw has detached in between."""
    return page.evaluate(f"({script})(document.querySelector('.cgpu-live'))")


def panel_state(frame):
    """What a user sees change: the state line and the chart's first line."""
    return (frame.locator(".cgpu-state").first.inner_text(),
            frame.locator("svg.cgpu-chart polyline").first.get_attribute("points"))


def test_jupyterlab_shows_the_live_widget_and_it_keeps_moving(browser, jupyterlab):
    base, token = jupyterlab
    page = browser.new_page()
    page.goto(f"{base}/lab/tree/live.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)  # the kernel is up
    page.locator(".jp-Cell").first.click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    panel = page.locator(".cgpu-live")
    panel.wait_for(timeout=60_000)
    assert "REPLAY of a recorded trace (nanogpt-8gpu-training_gpus0-3.csv)" in panel.inner_text()
    assert panel.locator("svg.cgpu-chart").count() == 3  # busy, power, temperature: the log has no memory
    first = panel_state(page)
    time.sleep(3)
    later = panel_state(page)
    assert later[0] != first[0]  # "sampling every 0.25 s, N samples over T s" moved on
    assert later[1] != first[1]  # the chart's line grew
    for name, shot in (("JupyterLab Light", "jupyterlab-live-light.png"), ("JupyterLab Dark", "jupyterlab-live-dark.png")):
        theme(page, name)
        on_panel(page, "panel => panel.scrollIntoView({block: 'nearest'})")
        page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
        # From the back of a classroom: labels of 13 px or more, in the theme's own text colour.
        labels = on_panel(page, LEGIBILITY)
        assert len(labels) > 20 and all(size >= 13 and contrast >= 4.5 for _, size, contrast in labels), (name, labels)
        edges = on_panel(page, NUMBER_EDGES)
        assert len(edges) == 4 and len(set(edges)) == 1, edges  # "5%" ends where "100%" does
    theme(page, "JupyterLab Light")
    page.close()


def test_the_live_page_chart_updates_in_chromium(browser):
    from colab_gpu import live

    sampler, _ = live.start(demo=True, interval=0.2)
    try:
        server = live.page_server()
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_selector(".cgpu-live svg.cgpu-chart polyline", timeout=20_000)
        assert page.title().startswith("REPLAY of a recorded trace")
        first = panel_state(page)
        time.sleep(2)
        later = panel_state(page)
        page.screenshot(path=str(ARTIFACTS / "live-page.png"), full_page=True)
        assert later[0] != first[0] and later[1] != first[1]
        live.stop("%gpu_status --stop")
        page.wait_for_function("document.getElementById('cgpu-note').textContent.includes('stopped')",
                               timeout=15_000)
        # the header the page keeps says when and why, not "sampling" (nor "its server is gone")
        header = page.locator(".cgpu-state").inner_text()
        assert "sampling" not in header and " by %gpu_status --stop, " in header, header
        assert page.locator("#cgpu-note").inner_text() == "The monitor has stopped."
        page.screenshot(path=str(ARTIFACTS / "live-page-stopped.png"), full_page=True)
        page.close()
    finally:
        live.stop()


def test_the_live_page_keeps_polling_after_one_lost_answer(browser):
    from colab_gpu import live

    sampler, _ = live.start(demo=True, interval=0.2)
    try:
        page = browser.new_page()
        polls = []

        def lose_the_third_answer(route):
            polls.append(route.request.url)
            route.abort() if len(polls) == 3 else route.continue_()

        page.route("**/data.json", lose_the_third_answer)
        page.goto(live.page_server().url)
        page.wait_for_function("document.querySelector('.cgpu-state') !== null", timeout=20_000)
        deadline = time.monotonic() + 20
        while len(polls) < 6:  # the lost one and a few after it
            assert time.monotonic() < deadline, f"the page stopped polling after {len(polls)} polls"
            page.wait_for_timeout(100)  # (not time.sleep: Playwright routes requests meanwhile)
        first = panel_state(page)
        page.wait_for_timeout(1000)
        assert panel_state(page) != first  # still moving
        assert page.locator("#cgpu-note").inner_text() == ""
        page.close()
    finally:
        live.stop()


# How far anything in the live card sticks out past the card's right edge, and what.
STICKS_OUT = """() => {
  const card = document.querySelector('.cgpu-card'), right = card.getBoundingClientRect().right;
  let worst = 0, what = '';
  card.querySelectorAll('*').forEach(element => {
    const past = element.getBoundingClientRect().right - right;
    if (past > worst) { worst = past; what = element.tagName + ' ' + element.textContent.slice(0, 40); }
  });
  return [Math.round(worst), what, document.documentElement.scrollWidth - innerWidth];
}"""


def test_the_live_page_fits_a_400_px_frame(browser):
    """In a 400 px frame (a phone, a narrow Colab window) the table ran 140 px past the card:
    power and temperature outside its border, the page scrolled sideways. Its cells now wrap
    and drop their bars; every number is still there."""
    from colab_gpu import live

    live.start(demo=True, interval=0.2)
    try:
        page = browser.new_page()
        page.set_viewport_size({"width": 400, "height": 700})
        page.goto(live.page_server().url)
        page.wait_for_selector(".cgpu-live svg.cgpu-chart polyline", timeout=20_000)
        page.screenshot(path=str(ARTIFACTS / "live-page-400px.png"), full_page=True)
        assert page.evaluate(STICKS_OUT) == [0, "", 0]
        row = page.locator(".cgpu-live tr").nth(1).inner_text()
        # the demo trace records no memory: that column is left out, as on the card
        assert re.search(r"\d+%\s+[\d.]+\sW\s+\d+\s°C", row), row
        page.set_viewport_size({"width": 1200, "height": 700})  # wide: the bars are back
        assert page.locator(".cgpu-live .cgpu-bar").first.is_visible()
        page.close()
    finally:
        live.stop()


@pytest.mark.parametrize("width", [300, 320, 360])
def test_the_live_panel_and_its_stopped_view_fit_a_phone(browser, width):
    """In a notebook 300-360 px wide (a phone), the widget's panel and the view its stop leaves
    ran 160-280 px past the card: its cells stayed on one line. Below 600 px they now wrap and
    drop their bars, with a 40 px output prompt beside the card as JupyterLab draws one."""
    from colab_gpu import live
    from colab_gpu.live.panel import render_panel
    from colab_gpu.live.render import stopped_view

    views = {}
    for name, options in (("demo", {"demo": True}), ("v100s", {"path": str(ROOT / "colab_gpu" / "data" / "v100s-pcie-32gb_miris.csv")})):
        sampler = live.start(interval=0.1, **options)[0]
        try:
            while len(sampler.samples()) < 5:
                time.sleep(0.05)
            views[f"{name} live"] = render_panel(sampler)
        finally:
            live.stop()
        views[f"{name} stopped"] = stopped_view(sampler, live.record_of(sampler))["text/html"]
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 800})
    for name, html in views.items():
        page.set_content(f"<html><body style='margin:8px 8px 8px 40px'>{html}</body></html>")
        assert page.evaluate(STICKS_OUT) == [0, "", 0], (name, width)
        assert re.search(r"GPU\s0.*\d+%", page.locator(".cgpu-live tr").nth(1).inner_text(), re.S), name
    page.screenshot(path=str(ARTIFACTS / f"live-stopped-{width}px.png"), full_page=True)
    page.close()


def test_the_live_page_comes_back_after_a_longer_silence(browser):
    """A laptop waking up or a network changing leaves the page without answers for several
    seconds while the monitor runs on. After five lost polls the page said "The monitor has
    stopped (its server is gone)" and never asked again; it now says what it knows, keeps
    asking every few seconds and moves on once the answers come back."""
    from colab_gpu import live

    live.start(demo=True, interval=0.2)
    try:
        page = browser.new_page()
        silent = []  # not empty: every poll is lost
        page.route("**/data.json", lambda route: route.abort() if silent else route.continue_())
        page.clock.install()  # the page's timers run when the test says, not in real seconds

        def run_until(condition: str, step_ms: int, what: str) -> None:
            deadline = time.monotonic() + 15
            while not page.evaluate(condition):
                assert time.monotonic() < deadline, f"{what}: {page.locator('#cgpu-note').inner_text()!r}"
                page.clock.run_for(step_ms)
                page.wait_for_timeout(50)  # the poll in flight gets its answer or its error

        page.goto(live.page_server().url)
        run_until("document.querySelector('.cgpu-state') !== null", 200, "no first sample")
        silent.append(True)
        run_until("document.getElementById('cgpu-note').textContent.includes('last sample seen')", 500, "never gave up")
        note = page.locator("#cgpu-note").inner_text()
        assert "stopped or the connection dropped" in note and "Trying again every 5 s" in note, note
        before = page.locator(".cgpu-state").inner_text()
        silent.clear()
        run_until("document.getElementById('cgpu-note').textContent === ''", 1000, "never asked again")
        run_until(f"document.querySelector('.cgpu-state').innerText !== {json.dumps(before)}", 200,
                  "the panel did not move on")
        page.close()
    finally:
        live.stop()


def test_the_live_page_in_a_tab_of_its_own_logs_no_error(browser):
    """Opened at live_url() in a tab, the page's console showed "Failed to load resource: the
    server responded with a status of 404" at every load: the browser asked for /favicon.ico."""
    from colab_gpu import live

    live.start(demo=True, interval=0.2)
    try:
        page = browser.new_page()
        console, answers = [], []
        page.on("console", lambda message: console.append((message.type, message.text)))
        page.on("response", lambda response: answers.append((response.status, response.url)))
        page.goto(live.page_server().url)
        deadline = time.monotonic() + 20
        while sum(url.endswith("/data.json") for _, url in answers) < 4:  # well after the load
            assert time.monotonic() < deadline, answers
            page.wait_for_timeout(100)
        assert [(kind, text) for kind, text in console if kind in ("error", "warning")] == []
        assert [(status, url) for status, url in answers if status != 200] == []
        page.close()
    finally:
        live.stop()


# A lesson as a teacher hands it out: the monitor started, a cell of "training", --stop.
LESSON = ["%load_ext colab_gpu", "%gpu_status --live --demo --interval 0.1", "import time\ntime.sleep(2)",
          "%gpu_status --stop"]
CHART_ALT = "replay of nanogpt-8gpu-training_gpus0-3.csv: chart of the samples kept"

# Each chart image in the notebook's outputs: (its cell, its alt text, its width once loaded; 0 if it did not).
CHART_IMAGES = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].flatMap((cell, index) =>
  [...cell.querySelectorAll('.jp-OutputArea-output img')].map(image => [index, image.alt, image.naturalWidth]))"""


def lesson_notebook(outputs=None) -> dict:
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in LESSON])
    notebook.metadata["kernelspec"] = NOTEBOOK["metadata"]["kernelspec"]
    return json.loads(nbformat.writes(notebook))


def reopened(browser, base: str, token: str, path: str, shot: str, app: str = "lab"):
    """``path`` opened in a fresh page with a fresh kernel, as a student opens a notebook they
    were given: (the page, what its notebook says). Screenshots in the light and dark themes."""
    for session in api(base, token, "/api/sessions"):  # the kernel that ran it, and its widgets, are gone
        if session["path"].endswith(path):
            api(base, token, f"/api/sessions/{session['id']}", "DELETE")
    page = browser.new_page()
    open_notebook(page, base, token, path, app)
    # --stop's chart, in the last cell: every output above it has been drawn by then.
    page.wait_for_function(f"({CHART_IMAGES})().some(([cell, , width]) => cell === 3 && width > 0)", timeout=90_000)  # 30 s ran out once on a loaded 2-core machine
    page.wait_for_timeout(1000)  # a widget view would have tried to draw itself by now
    for name, suffix in (("JupyterLab Light", "light"), ("JupyterLab Dark", "dark")):
        theme(page, name)
        page.screenshot(path=str(ARTIFACTS / f"{shot}-{suffix}.png"), full_page=True)
    theme(page, "JupyterLab Light")
    return page, page.locator(".jp-Notebook").inner_text()


def assert_shows_the_stopped_monitor(page, text: str) -> None:
    assert "Error displaying widget" not in text and "model not found" not in text
    # The live cell's last state and the run's chart, then --stop's summary and the same chart.
    assert [(cell, alt) for cell, alt, width in page.evaluate(CHART_IMAGES) if width > 0] == \
        [(1, CHART_ALT), (3, CHART_ALT)]
    live = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea-output")
    assert re.search(r"REPLAY of a recorded trace \(nanogpt-8gpu-training_gpus0-3\.csv\).*stopped at "
                     r"\d\d:\d\d:\d\d by %gpu_status --stop", live.inner_text(), re.S), live.inner_text()


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_a_notebook_run_saved_and_reopened_shows_the_stopped_monitor_not_a_widget_error(browser, jupyterlab, app):
    """A notebook where the live monitor ran, saved and reopened (also after --stop), showed
    "Error displaying widget: model not found" in its place: a widget's view needs its kernel.
    The stop turns it into static HTML with the run's chart, in the running page already. In
    JupyterLab and in Notebook 7, run, saved and reopened in the same front end."""
    base, token = jupyterlab
    path = f"lesson-{app}.ipynb"
    api(base, token, f"/api/contents/{path}", "PUT", {"type": "notebook", "content": lesson_notebook()})
    page = browser.new_page()
    open_notebook(page, base, token, path, app)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.locator(".jp-Cell").nth(3).locator(".cgpu-card img").wait_for(timeout=90_000)
    live = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea-output")
    live.locator("img").wait_for(timeout=30_000)  # the widget became the static view, in this page too
    assert live.locator(".jupyter-widgets").count() == 0
    wait_idle(page, 30_000)
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + 30
    while True:  # saved: the file holds the static view, not the widget
        saved = api(base, token, f"/api/contents/{path}")["content"]["cells"][1]["outputs"]
        if saved and "image/png" in saved[0]["data"]:
            break
        assert time.monotonic() < deadline, saved
        time.sleep(0.5)
    assert not any("widget" in mime for output in saved for mime in output.get("data", {}))
    page.close()
    page, text = reopened(browser, base, token, path, f"{'jupyterlab' if app == 'lab' else 'notebook7'}-reopened", app)
    assert_shows_the_stopped_monitor(page, text)
    page.close()


def test_a_notebook_executed_elsewhere_opens_in_jupyterlab_with_the_stopped_monitor(browser, jupyterlab):
    """The same lesson executed without a browser (nbclient, as CI and nbconvert --execute
    do) and opened in JupyterLab: untrusted, its HTML is sanitized; the chart still shows."""
    import nbformat

    from kernel import execute

    notebook = nbformat.reads(json.dumps(lesson_notebook()), as_version=4)
    execute(notebook, timeout=120)
    base, token = jupyterlab
    api(base, token, "/api/contents/handout.ipynb", "PUT", {"type": "notebook", "content": json.loads(nbformat.writes(notebook))})
    page, text = reopened(browser, base, token, "handout.ipynb", "jupyterlab-handout")
    assert_shows_the_stopped_monitor(page, text)
    page.close()


NOTEBOOKS = ROOT / "notebooks"
# How far the notebook scrolls: JupyterLab scrolls it inside the page, so a screenshot of the page
# holds what a window that much taller shows.
SCROLL_RANGE = """() => { const outer = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
  return outer.scrollHeight - outer.clientHeight; }"""


@pytest.mark.parametrize("name", sorted(path.name for path in NOTEBOOKS.glob("*.ipynb")))
def test_every_teaching_notebook_executed_reads_in_both_themes(browser, jupyterlab, name):
    """Each teaching notebook executed as CI does (nbclient), opened in JupyterLab as a student
    is handed it: no widget error; screenshots of the whole
    notebook in the light and dark themes under test-artifacts/notebooks/ for a person to look at."""
    import nbformat

    from kernel import execute

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    with pytest.MonkeyPatch.context() as patch:  # a student's kernel starts without torch settings
        for variable in [variable for variable in os.environ if variable.startswith("PYTORCH_")]:
            patch.delenv(variable)
        execute(notebook, cwd=NOTEBOOKS, timeout=120)
    base, token = jupyterlab
    path = f"executed-{name}"
    api(base, token, f"/api/contents/{path}", "PUT", {"type": "notebook", "content": json.loads(nbformat.writes(notebook))})
    page = browser.new_page()
    open_notebook(page, base, token, path)
    page.wait_for_timeout(1000)  # a widget view would have tried to draw itself by now
    # as tall as the notebook scrolls (JupyterLab draws only the cells a window shows)
    page.set_viewport_size({"width": 1200, "height": min(900 + page.evaluate(SCROLL_RANGE), 30_000)})
    page.wait_for_timeout(1000)  # the cells the taller window shows, drawn
    text = page.locator(".jp-Notebook").inner_text()
    assert "Error displaying widget" not in text and "model not found" not in text
    folder = ARTIFACTS / "notebooks"
    folder.mkdir(parents=True, exist_ok=True)
    for theme_name, suffix in (("JupyterLab Light", "light"), ("JupyterLab Dark", "dark")):
        theme(page, theme_name)
        page.screenshot(path=str(folder / f"{name.removesuffix('.ipynb')}-{suffix}.png"), full_page=True)
    theme(page, "JupyterLab Light")
    page.close()
    api(base, token, f"/api/contents/{path}", "DELETE")
