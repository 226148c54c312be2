"""Figures for slides and the saved page's view: headless Chromium, real gunicorn.

The Q · Kᵀ matrices, every head's weights side by side and a stack's residual-stream table download as SVG and as
PNG at 2× (as the maps, the √d_k comparison and the block diagram do, tests/test_viewer_present.py): each file has
the figure's title, the sentence, and the numbers the page shows. A page saved from the viewer ("Download HTML")
opens on the view it was saved from (text scale, theme, query, head, clicked cell) with no address fragment.
"""

from __future__ import annotations

import re
from xml.etree import ElementTree

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from viewer_browser_support import (
    clear_downloads,
    fragment,
    js,
    open_page,
    png_size,
    service_trace,
    wait_download,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

SVG = "{http://www.w3.org/2000/svg}"


def click(driver, selector: str) -> None:
    """Click a button, scrolled to the middle of the screen (clear of the sticky controls)."""
    button = driver.find_element(By.CSS_SELECTOR, selector)
    js(driver, "arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()


def download_figure(driver, downloads, figure: str) -> tuple[ElementTree.Element, list[str]]:
    """The figure's SVG (parsed) and its texts, after checking that its PNG is the SVG at 2×."""
    click(driver, f'button[data-svg="{figure}"]')
    svg = wait_download(downloads, f"*_{figure}.svg").read_text(encoding="utf-8")
    root = ElementTree.fromstring(svg.encode())
    click(driver, f'button[data-png="{figure}"]')
    png = wait_download(downloads, f"*_{figure}.png")
    assert png_size(png) == (2 * int(root.get("width")), 2 * int(root.get("height"))), figure
    for kind in ("svg", "png"):  # each button has a name of its own, not only "Download SVG"
        name = driver.find_element(By.CSS_SELECTOR, f'button[data-{kind}="{figure}"]').accessible_name
        assert name.startswith("Download ") and name.endswith("as SVG" if kind == "svg" else "as PNG (2×)"), name
    return root, [t.text or "" for t in root.iter(SVG + "text")]


def grid_numbers(root: ElementTree.Element) -> list[list[str]]:
    """Each grid's cells in order, the number written on each ('' for none)."""
    out = []
    for grid in root.iter(SVG + "g"):
        if grid.get("class") != "grid":
            continue
        cells = next(g for g in grid if g.get("class") == "cells")
        out.append([(c.find(SVG + "text").text if c.find(SVG + "text") is not None else "") for c in cells])
    return out


def test_the_matrices_and_every_heads_weights_download_as_svg_and_png(driver, server, console, browser_dirs):
    downloads = clear_downloads(browser_dirs)
    open_page(
        driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=2, head=1)
    )
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'button[data-svg="heads"]'))

    root, texts = download_figure(driver, downloads, "matrices_head1")
    assert texts[0] == driver.find_element(By.ID, "matrices-title").text == "Q · Kᵀ = scores, head 1"
    assert "“the cat sat on the mat”" in texts
    shown = js(
        driver,
        """return ['Q', 'KT', 'scores'].map((m) => [...document.querySelectorAll(
        `table[data-matrix="${m}"] td.mx-cell`)].map((td) => td.textContent));""",
    )
    assert grid_numbers(root) == shown
    assert all(len(cells) == 36 and all(cells) for cells in shown)  # 6 × 6 each, every cell with its number

    root, texts = download_figure(driver, downloads, "heads")
    assert texts[0] == "Every head's weights, side by side"
    assert "“the cat sat on the mat”" in texts
    shown = js(
        driver,
        """return [...document.querySelectorAll('.thumb')].map((t) =>
        [...t.querySelectorAll('.thumb-cell')].map((c) => c.textContent));""",
    )
    assert len(shown) == 4 and grid_numbers(root) == shown
    assert any(c == "" for c in shown[0]) and any(c for c in shown[0])  # causal: masked cells, and numbers
    captions = [t.text for t in root.iter(SVG + "text") if (t.text or "").startswith("head ")]
    assert [c.split(":")[0] for c in captions] == ["head 0", "head 1", "head 2", "head 3"]


def test_a_stacks_residual_stream_table_downloads_as_svg_and_png(driver, server, console, browser_dirs):
    downloads = clear_downloads(browser_dirs)
    open_page(
        driver,
        server,
        fragment(
            sentence="the cat sat", d_model=24, num_heads=2, block="gpt2", layers=2, layer=1, causal=1, q=1, head=0
        ),
    )
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'button[data-svg="residual"]'))
    root, texts = download_figure(driver, downloads, "residual")
    assert texts[0].startswith(driver.find_element(By.ID, "residual-title").text)
    assert "“the cat sat”" in texts
    shown = js(
        driver, "return [...document.querySelectorAll('#residual-body td.rs-cell')].map((td) => td.textContent);"
    )
    assert grid_numbers(root) == [shown] and len(shown) == 3 * 3
    sentence = driver.find_element(By.CSS_SELECTOR, "#residual-body .explain").text
    assert any(t and sentence.startswith(t) for t in texts), (sentence, texts[-3:])


def test_a_page_saved_from_the_viewer_opens_on_its_view(driver, server, console, browser_dirs):
    downloads = clear_downloads(browser_dirs)
    open_page(
        driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=1, head=2)
    )
    cell = 'table[data-stage="weights"] td[data-row="3"][data-col="1"]'
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, cell))
    Select(driver.find_element(By.ID, "text-scale")).select_by_visible_text("150%")
    Select(driver.find_element(By.ID, "theme")).select_by_value("dark")
    click(driver, cell)
    wait_until(driver, lambda d: all(p in d.current_url for p in ("key=1", "q=3", "text=150", "theme=dark")))
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#explain-body table"))
    click(driver, "#download-html")
    path = wait_download(downloads, "*.html")
    page = path.read_text(encoding="utf-8")
    view = re.findall(r'<script type="application/json" id="view-state">([^<]*)</script>', page)
    assert len(view) == 1 and "sentence" not in view[0], view  # the selection only: the trace is the page's own

    driver.get("about:blank")
    driver.get(path.as_uri())  # no fragment
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#explain-body table"))
    assert driver.find_element(By.ID, "text-scale").get_attribute("value") == "1.5"
    assert driver.find_element(By.ID, "theme").get_attribute("value") == "dark"
    assert js(driver, "return document.documentElement.dataset.theme") == "dark"
    assert (
        js(driver, "return getComputedStyle(document.documentElement).getPropertyValue('--text-scale').trim()") == "1.5"
    )
    assert "head 2 of 4" in driver.find_element(By.ID, "walkthrough-title").text
    assert "is-explained" in driver.find_element(By.CSS_SELECTOR, cell).get_attribute("class")
    assert js(driver, "return document.querySelectorAll('[data-csp-violations]').length") == 0
    # An address fragment still wins over the saved view.
    driver.get("about:blank")
    driver.get(path.as_uri() + "#q=1&head=0")
    wait_until(driver, lambda d: "head 0 of 4" in d.find_element(By.ID, "walkthrough-title").text)
    assert driver.find_element(By.ID, "text-scale").get_attribute("value") == "1"
    assert driver.find_element(By.ID, "theme").get_attribute("value") == "system"


def test_a_page_written_with_a_view_opens_on_it(driver, server, console, tmp_path):
    # What the command line's `html --text 200 --theme contrast` writes (viewer/offline_page.py, view=).
    from viewer.offline_page import render_html

    body = {"sentence": "the cat sat", "d_model": 24, "num_heads": 2}
    page = tmp_path / "lecture.html"
    page.write_text(render_html(service_trace(server, body), body, view="text=200&theme=contrast"), encoding="utf-8")
    driver.get("about:blank")
    driver.get(page.as_uri())
    wait_until(driver, lambda d: d.find_element(By.ID, "text-scale").get_attribute("value") == "2")
    assert driver.find_element(By.ID, "theme").get_attribute("value") == "contrast"
    assert js(driver, "return document.documentElement.dataset.theme") == "contrast"


def test_a_large_figure_still_makes_its_png(driver, server, console, browser_dirs):
    # 4 heads of 12 tokens: an SVG of some 140 kB, more bytes than one call's arguments may hold.
    downloads = clear_downloads(browser_dirs)
    sentence = "the cat sat on the mat and the dog lay on the rug"
    open_page(driver, server, fragment(sentence=sentence, d_model=24, num_heads=4, q=1, head=0))
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'button[data-svg="heads"]'))
    root, texts = download_figure(driver, downloads, "heads")
    assert len((next(downloads.glob("*_heads.svg"))).read_bytes()) > 120_000
    assert f"“{sentence}”" in texts
