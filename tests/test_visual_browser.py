"""What users see in a real JupyterLab in Chromium, in its dark theme, in a notebook 600 px
wide (a Colab side panel, a phone): the magics' cards run in a real kernel, then measured.

Uses tests/test_browser.py's Chromium and JupyterLab (and its skips where they are absent).
Screenshots are saved under test-artifacts/ for a person to look at.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from conftest import ROOT
from test_browser import ARTIFACTS, browser, jupyterlab  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

CELLS = [
    "%load_ext colab_gpu\nimport colab_gpu",
    f"%gpu_status --from {ROOT}/colab_gpu/data/tesla-t4.xml",
    "%alloc_conf max_split_size_mb=128 roundup_power2_divisions:[256:1,512:2,>:4] "
    "garbage_collection_threshold=0.6 expandable_segments=True",
    "colab_gpu.find_batch(lambda size: None, max=64, device='cpu', progress=False)",
    "%gpu_status --live --demo --interval 0.1",
    "import time\ntime.sleep(1)\n%gpu_status --stop",  # its card comes after the live widget's
]
NOTEBOOK = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                       "source": source} for source in CELLS],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def put(base: str, token: str, path: str, body: dict) -> None:
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="PUT",
                                     headers={"Authorization": f"token {token}",
                                              "Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()


# Per output holding a card: how far anything inside sticks out past the output's right edge.
OVERFLOW = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .filter(output => output.querySelector('.cgpu-card'))
  .map(output => {
    const right = output.getBoundingClientRect().right;
    let worst = 0, what = '';
    output.querySelectorAll('.cgpu-card, .cgpu-card *').forEach(element => {
      const past = element.getBoundingClientRect().right - right;
      if (past > worst) { worst = past; what = element.tagName + ' ' + element.textContent.slice(0, 40); }
    });
    return [output.querySelector('.cgpu-card').textContent.slice(0, 30), Math.round(worst), what];
  })"""

# The chart images' top-left pixel as the notebook draws it: alpha 0 lets the theme through.
CHART_CORNERS = """() => [...document.querySelectorAll('.cgpu-card img')].map(image => {
  const canvas = document.createElement('canvas');
  canvas.width = image.naturalWidth; canvas.height = image.naturalHeight;
  const context = canvas.getContext('2d');
  context.drawImage(image, 0, 0);
  return [image.alt, context.getImageData(1, 1, 1, 1).data[3]];
})"""


# Each number and its unit in the cards' text ("388 MiB", "26.8 W"): split when the number's
# first character and the unit's last sit on different lines.
SPLIT_UNITS = r"""() => {
  const pattern = /\d+(?:\.\d+)?[ \u00a0](?:B|KiB|MiB|GiB|TiB|%|W|°C|MHz)(?!\w)/g;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const split = [];
  let checked = 0;
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.parentElement.closest('.cgpu-card') || node.parentElement.closest('style, svg')) continue;
    for (const match of node.data.matchAll(pattern)) {
      const top = offset => {
        const range = document.createRange();
        range.setStart(node, offset); range.setEnd(node, offset + 1);
        return range.getBoundingClientRect().top;
      };
      checked += 1;
      if (Math.abs(top(match.index) - top(match.index + match[0].length - 1)) > 2) split.push(match[0]);
    }
  }
  return [checked, split];
}"""


def alignments(cells):
    return cells.evaluate_all("cells => cells.map(cell => getComputedStyle(cell).textAlign)")


def test_cards_read_in_the_dark_theme_at_600_px(browser, jupyterlab):  # noqa: F811 (fixtures)
    base, token = jupyterlab
    put(base, token, "/lab/api/settings/@jupyterlab/apputils-extension:themes",
        {"raw": json.dumps({"theme": "JupyterLab Dark"})})
    put(base, token, "/api/contents/visual.ipynb", {"type": "notebook", "content": NOTEBOOK})
    page = browser.new_page()
    page.set_viewport_size({"width": 780, "height": 900})
    page.goto(f"{base}/lab/tree/visual.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
    assert page.get_attribute("body", "data-jp-theme-light") == "false"
    if page.locator("#jp-left-stack").is_visible():  # the notebook gets the width
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
    page.get_by_text("Run All Cells", exact=True).click()
    page.locator(".jp-Cell").last.locator(".cgpu-card img").wait_for(timeout=90_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "cards-dark-600px.png"), full_page=True)

    width = page.locator(".jp-OutputArea-output").first.evaluate("output => output.clientWidth")
    assert 560 <= width <= 640, f"the outputs are {width} px wide, not about 600"
    cards = page.evaluate(OVERFLOW)
    assert len(cards) == 5  # status, alloc_conf, find_batch, the stopped live view, the run's record
    status, batch = page.locator(".jp-Cell").nth(1), page.locator(".jp-Cell").nth(3)
    rows = batch.locator(".cgpu-card tr")
    assert rows.count() > 2
    checked, split = page.evaluate(SPLIT_UNITS)
    assert checked >= 20  # the sizes, powers, temperatures and clocks of the five cards
    seen = {
        # Before: the allocator string, find_batch's 720 px chart and the live widget stuck out.
        "cards sticking out": [card for card in cards if card[1] > 1],
        # JupyterLab right-aligns output table cells: prose values came out ragged on the left.
        "status values": set(alignments(status.locator(".cgpu-card td:not(.cgpu-label)"))),
        # find_batch's table: numbers right (digits line up), the outcome left, headers alike.
        "find_batch columns": [alignments(rows.nth(row).locator("th, td")) for row in range(rows.count())],
        # Its facts are plain lines, not drawn as advice (a coloured bar before each).
        "find_batch fact bars": set(batch.locator(".cgpu-facts li, ul.cgpu-muted li").evaluate_all(
            "items => items.map(item => getComputedStyle(item).borderLeftWidth)")),
        # Charts (find_batch's, the stopped live view's, the run's record's): no white box in the dark theme.
        "chart corner alpha": [alpha for _, alpha in page.evaluate(CHART_CORNERS)],
        # "388" at the end of a line, "MiB" on the next (the status card's memory row).
        "numbers split from their unit": split,
    }
    assert seen == {
        "cards sticking out": [],
        "status values": {"left"},
        "find_batch columns": [["right", "left", "right", "right", "right"]] * rows.count(),
        "find_batch fact bars": {"0px"},
        "chart corner alpha": [0, 0, 0],
        "numbers split from their unit": [],
    }
    page.close()
