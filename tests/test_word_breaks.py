"""Long messages in the HTML cards break at spaces, and inside a long token only at its joints
or where nothing else fits: ``overflow-wrap: anywhere`` broke "ever|y key" and "%gpu_s|tatus"
(it lets a table squeeze a column of prose to a few letters).

The markup is checked here; the page as Chromium lays it out at 360 px (a phone, a Colab side
panel) in the half below, which uses tests/test_browser.py's Chromium and skips with it.
"""
from __future__ import annotations

import re

import pytest
from conftest import ROOT

import colab_gpu
from colab_gpu.render.html import STYLE, unbroken_units


def cards():
    """The cards whose text runs longest: a status with advice, one with no GPU read, an
    allocator setting of four keys, a search report with notes."""
    yield colab_gpu.status(path=str(ROOT / "colab_gpu" / "data" / "tesla-t4.xml"))._repr_html_()
    yield colab_gpu.status()._repr_html_()
    yield colab_gpu.alloc_conf(["max_split_size_mb=128", "roundup_power2_divisions:[256:1,512:2,>:4]",
                                "garbage_collection_threshold=0.6", "expandable_segments=True"])._repr_html_()
    yield colab_gpu.find_batch(lambda size: None, start=5, max=64, multiple_of=3, device="cpu",
                               progress=False)._repr_html_()


def test_no_card_breaks_words_anywhere():
    assert "anywhere" not in STYLE and "overflow-wrap:break-word;word-break:normal" in STYLE
    for html in cards():
        for sheet in re.findall(r"<style>(.*?)</style>", html, re.DOTALL):
            assert "anywhere" not in sheet and "break-all" not in sheet


def test_a_long_token_may_break_at_its_joints_and_nothing_else_is_touched():
    html = ("<style>.a_b_c_d_e_f_g_h_i_j_k{color:red}</style><p title='x_y_z_x_y_z_x_y_z_x_y_z'>"
            "written to PYTORCH_CUDA_ALLOC_CONF, a short_name and 388 MiB</p><table><tr>"
            "<td class='cgpu-label'>environment</td><td>PYTORCH_CUDA_ALLOC_CONF = 'max_split_size_mb:128,"
            "roundup_power2_divisions:[256:1,512:2,&gt;:4]' 0.6 torch.cuda.set_per_process_memory_fraction"
            "</td></tr></table>")
    assert unbroken_units(html) == (
        "<style>.a_b_c_d_e_f_g_h_i_j_k{color:red}</style><p title='x_y_z_x_y_z_x_y_z_x_y_z'>"
        # prose: a 23-letter name moves to the next line whole
        "written to PYTORCH_CUDA_ALLOC_CONF, a short_name and 388&nbsp;MiB</p><table><tr>"
        "<td class='cgpu-label'>environment</td><td>PYTORCH_<wbr>CUDA_<wbr>ALLOC_<wbr>CONF = "
        "'max_<wbr>split_<wbr>size_<wbr>mb:<wbr>128,<wbr>roundup_<wbr>power2_<wbr>divisions:<wbr>"
        "[256:<wbr>1,<wbr>512:<wbr>2,<wbr>&gt;:<wbr>4]' 0.6 torch.<wbr>cuda.<wbr>set_<wbr>per_<wbr>"
        "process_<wbr>memory_<wbr>fraction</td></tr></table>")
    long_call = "(torch.cuda.set_per_process_memory_fraction(fraction, device)"  # 40+ outside a table
    assert unbroken_units(f"<li>set {long_call}</li>") == (
        "<li>set (torch.<wbr>cuda.<wbr>set_<wbr>per_<wbr>process_<wbr>memory_<wbr>fraction(fraction,<wbr> device)</li>")


# Per card: how far its content is wider than the card (a table pushed past it), and the pieces
# of text (between spaces, <wbr>s and after hyphens: "CPU-|only" is a hyphen's own break) of 25
# characters or less whose first and last characters sit on different lines: a word broken
# where a space or a joint was free.
LAYOUT = r"""() => [...document.querySelectorAll('.cgpu-card')].map(card => {
  const broken = [];
  const walker = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest('style')) continue;
    for (const match of node.data.matchAll(/[^\s-]+-?/g)) {
      if (match[0].length < 2 || match[0].length > 25) continue;
      const top = offset => {
        const range = document.createRange();
        range.setStart(node, offset); range.setEnd(node, offset + 1);
        return range.getBoundingClientRect().top;
      };
      if (Math.abs(top(match.index) - top(match.index + match[0].length - 1)) > 2) broken.push(match[0]);
    }
  }
  return [card.textContent.slice(0, 30), card.scrollWidth - card.clientWidth, broken];
})"""


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
