"""Long messages in the HTML cards break at spaces, and inside a word only where nothing else
fits: ``overflow-wrap: anywhere`` broke "ever|y key" and "%gpu_s|tatus" (it lets a table or a
narrow front end squeeze a block of prose to a few letters).

The markup is checked here; the page as Chromium lays it out at 360 px (a phone, a Colab side
panel) in the half below, which uses tests/test_browser.py's Chromium and skips with it.
"""
from __future__ import annotations

import re

import pytest
from conftest import ROOT

import colab_gpu
from colab_gpu.render.html import STYLE


def cards():
    """The cards whose text runs longest: a status with advice, one with no GPU read, an
    allocator setting of four keys, a search report with notes."""
    yield colab_gpu.status(path=str(ROOT / "colab_gpu" / "data" / "tesla-t4.xml"))._repr_html_()
    yield colab_gpu.status()._repr_html_()
    yield colab_gpu.alloc_conf(["max_split_size_mb=128", "roundup_power2_divisions:[256:1,512:2,>:4]",
                                "garbage_collection_threshold=0.6", "expandable_segments=True"])._repr_html_()
    yield colab_gpu.find_batch(lambda size: None, start=5, max=64, multiple_of=3, device="cpu",
                               progress=False)._repr_html_()


def test_words_break_only_where_nothing_else_fits():
    """``anywhere`` on the card let a squeezed column or block break any word; only the value
    cells of a label/value table keep it, where their label keeps its width."""
    assert "overflow-wrap:break-word;word-break:normal" in STYLE
    assert [line for line in STYLE.splitlines() if "anywhere" in line] == [
        ".cgpu-card td.cgpu-label+td{overflow-wrap:anywhere}"]
    for html in cards():
        for sheet in re.findall(r"<style>(.*?)</style>", html, re.DOTALL):
            assert "break-all" not in sheet and sheet.count("anywhere") <= 1


# Per card: how far its content is wider than the card (a table pushed past it), and the words
# broken across lines that would have fitted whole on a line of their block: a break inside a
# word where a space was free. Words are runs without a space, a hyphen ending one ("CPU-|only"
# is the hyphen's own break); each is measured in its element's font.
LAYOUT = r"""() => {
  const context = document.createElement('canvas').getContext('2d');
  return [...document.querySelectorAll('.cgpu-card')].map(card => {
    const broken = [];
    const walker = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const element = node.parentElement;
      if (element.closest('style')) continue;
      const block = element.closest('td, th, li, p, h4, div');
      const style = getComputedStyle(block);
      const room = block.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      context.font = getComputedStyle(element).font;
      for (const match of node.data.matchAll(/[^\s-]+-?/g)) {
        if (match[0].length < 2 || context.measureText(match[0]).width >= room) continue;
        const top = offset => {
          const range = document.createRange();
          range.setStart(node, offset); range.setEnd(node, offset + 1);
          return range.getBoundingClientRect().top;
        };
        if (Math.abs(top(match.index) - top(match.index + match[0].length - 1)) > 2) broken.push(match[0]);
      }
    }
    return [card.textContent.slice(0, 30), card.scrollWidth - card.clientWidth, broken];
  });
}"""


@pytest.mark.browser
def test_cards_at_360_px_break_no_word_and_stay_inside(tmp_path):
    test_browser = pytest.importorskip("test_browser")
    page_html = ("<html><body style='margin:0;font-family:sans-serif'><div style='width:360px'>"
                 + "".join(cards()) + "</div></body></html>")
    with test_browser.sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=test_browser.CHROMIUM, headless=True,
                                             args=test_browser.CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 380, "height": 800})
            page.set_content(page_html)
            test_browser.ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(test_browser.ARTIFACTS / "cards-360px-word-breaks.png"), full_page=True)
            layout = page.evaluate(LAYOUT)
        finally:
            browser.close()
    assert len(layout) == 4
    bad = [(title, wider, broken) for title, wider, broken in layout if wider > 1 or broken]
    assert bad == [], bad
