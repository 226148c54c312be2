"""Present mode on a projector: headless Chromium at 1280×720 and 1024×768 (and 1920×1080), real gunicorn.

Each step of a 3-, 6- and 12-token trace and of a stack's block and residual-stream stages fits the screen above
the bar without scrolling (the slide zoomed down when it is too large, up on a larger screen) with its map and matrix
numbers at 16 px or more and its captions at 20 or more: a stage too busy for that is shown one figure a step, and a
figure too large even alone is cut to the columns and rows that fit, with a note. Page Down / Page Up, the arrows and
the space bar step through the figures and the stages, as a presenter's clicker does; the bar stays one line.
"""

from __future__ import annotations


import pytest
import requests
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from viewer_browser_support import ChromiumOptions, fragment, js, open_page, png_size, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

SCREENS = [(1280, 720), (1024, 768)]
SENTENCES = {3: "the cat sat", 6: "the cat sat on the mat", 12: "the cat sat on the mat and the dog lay on it"}


@pytest.fixture(scope="module")
def chromium_options() -> ChromiumOptions:
    return ChromiumOptions(args=("--force-color-profile=srgb", "--disable-quic"), size=SCREENS[0])


def screen(driver, width: int, height: int) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def where(driver) -> str:
    """The bar's title, one line: "Stage 3 of 8: Score: Q·Kᵀ — Kᵀ (3 of 5)" (the figure shown, on a busy stage)."""
    return " ".join(driver.find_element(By.ID, "present-where").text.split())


def fit(driver) -> dict:
    """How the slide on screen sits: the page's scroll height against the screen, the lowest visible part of the
    slide against the bar's top, the bar's height and its title's lines, the widest figure against its box."""
    return js(
        driver,
        """
        const bar = document.getElementById('present-bar').getBoundingClientRect();
        const title = document.getElementById('present-where');
        const lh = parseFloat(getComputedStyle(title).lineHeight) || 1.5 * parseFloat(getComputedStyle(title).fontSize);
        const shown = [...document.querySelectorAll('#main > *, #results [data-present]')]
          .filter((el) => el.offsetParent !== null && !el.hidden);
        const boxes = [...document.querySelectorAll('#results .hm-scroll, #results .mx-scroll')].filter((el) => el.offsetParent !== null);
        return {
          scroll: document.scrollingElement.scrollHeight, height: innerHeight, scrollY: scrollY,
          bottom: Math.max(...shown.map((el) => el.getBoundingClientRect().bottom)), barTop: bar.top, barHeight: bar.height,
          titleLines: Math.round(title.getBoundingClientRect().height / lh),
          wide: Math.max(0, ...boxes.map((el) => el.scrollWidth - el.clientWidth)),
          zoom: Number(document.documentElement.dataset.presentZoom || 0),
          parts: shown.map((el) => el.id || el.dataset.present),
          sliced: document.querySelectorAll('.present-slice-note').length,
        };""",
    )


def at_end(driver) -> bool:
    return driver.find_element(By.ID, "present-next").get_attribute("disabled") == "true"


def walk(driver, key_for_step=lambda i: Keys.PAGE_DOWN, limit: int = 80) -> list[tuple[str, dict, dict]]:
    """Every step from the one on screen to the last, each stepped to with key_for_step(i): its bar, what fit() and
    text_px() say on it."""
    seen = [(where(driver), fit(driver), text_px(driver))]
    for i in range(1, limit):
        if at_end(driver):
            return seen
        before = where(driver)
        ActionChains(driver).send_keys(key_for_step(i)).perform()
        wait_until(driver, lambda d, before=before: where(d) != before, f"step {i + 1} after {before}")
        seen.append((where(driver), fit(driver), text_px(driver)))
    raise AssertionError(f"no last step after {limit}: {seen[-1][0]}")


def stage_of(title: str) -> int:
    return int(title.split(" of ")[0].removeprefix("Stage "))


def assert_fits(label: str, state: dict) -> None:
    assert state["scroll"] <= state["height"] + 1 and state["scrollY"] == 0, f"{label} {state}"
    assert state["bottom"] <= state["barTop"] + 1, (label, state)
    assert state["wide"] <= 1, (label, state)
    assert state["titleLines"] == 1 and state["barHeight"] < 0.1 * state["height"], (label, state)


def assert_projector_text(label: str, px: dict) -> None:
    """The smallest map or matrix number on screen at 16 px or more, the smallest caption at 20 or more (a step with
    neither, a diagram or a text, has nothing to hold)."""
    assert px["numbers"] is None or px["numbers"] >= 16, (label, px)
    assert px["captions"] is None or px["captions"] >= 20, (label, px)


# The figures of each kind the walks below measured, smallest number / caption in screen px (1280×720; 1024×768):
# 3 tokens, Q · Kᵀ one at a time 26.8 / 27.2 (28.9), a map 26.2; 6 tokens, a map 20.2, the masked map with the
# walkthrough 16.5; 12 tokens, Q and the scores 18.2, a map 16.0 / 25.3; a stack's residual stream 16.0 (17.2); the
# √d_k comparison's numbers, a step of their own, 21.8 (18.7) at 3 and 6 tokens, 18.4 (18.7) at 12 and in a stack.
WALKS = {
    "3 tokens": dict(sentence=SENTENCES[3], d_model=24, num_heads=4, causal=1, q=1, head=0),
    "6 tokens": dict(sentence=SENTENCES[6], d_model=24, num_heads=4, causal=1, q=1, head=0),
    "12 tokens": dict(sentence=SENTENCES[12], d_model=24, num_heads=4, causal=1, q=1, head=0),
    "a stack": dict(
        sentence=SENTENCES[12], d_model=24, num_heads=4, causal=1, block="gpt2", layers=2, layer=1, q=1, head=0
    ),
}


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("view", sorted(WALKS))
def test_every_step_fits_at_a_projectors_text_size_and_the_clicker_walks_through_them(
    driver, server, console, size, view
):
    """Every step, from the first to the last: it fits without scrolling, its numbers are 16 px or more and its
    captions 20 or more (a busy stage one figure a step), the bar one line; the stages in order, each one's figures
    named in the bar; and back again the same steps in reverse."""
    screen(driver, *size)
    open_page(driver, server, fragment(**WALKS[view], present=1))
    wait_until(driver, lambda d: where(d).startswith("Stage 1 of"))
    keys = [Keys.PAGE_DOWN, Keys.ARROW_RIGHT, Keys.SPACE, Keys.ARROW_DOWN]
    steps = walk(driver, lambda i: keys[i % len(keys)])
    for title, state, px in steps:
        label = f"{view} at {size[0]}x{size[1]}: {title}"
        assert_fits(label, state)
        assert_projector_text(label, px)
        assert state["sliced"] == 0, label  # every figure of these fits whole at 16 px: nothing is cut
    titles = [t for t, _, _ in steps]
    total = int(titles[0].split(" of ")[1].split(":")[0])
    assert [stage_of(t) for t in titles] == sorted(stage_of(t) for t in titles), titles
    assert {stage_of(t) for t in titles} == set(range(1, total + 1)), titles
    assert len(set(titles)) == len(titles), titles
    # A stage shown one figure a step names the figure and counts them: "— Kᵀ (3 of 5)".
    busy = [t for t in titles if t.endswith(")") and " — " in t]
    if view != "3 tokens":
        assert any("Score" in t for t in busy), titles
    for t in busy:
        assert t.rsplit("(", 1)[1].rstrip(")").split(" of ")[0].isdigit(), t
    # Back again: Page Up, the left arrow, the up arrow and Shift+Space walk the same steps in reverse.
    back = [Keys.PAGE_UP, Keys.ARROW_LEFT, Keys.ARROW_UP, None]
    for i, title in enumerate(reversed(titles[:-1])):
        key = back[i % len(back)]
        if key is None:
            ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.SPACE).key_up(Keys.SHIFT).perform()
        else:
            ActionChains(driver).send_keys(key).perform()
        wait_until(driver, lambda d, title=title: where(d) == title, f"back to {title}")
    assert js(driver, "return scrollY;") == 0


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_stacks_block_and_residual_stages_fit(driver, server, console, size):
    screen(driver, *size)
    open_page(
        driver,
        server,
        fragment(
            sentence=SENTENCES[6],
            d_model=24,
            num_heads=2,
            causal=1,
            block="gpt2",
            layers=3,
            layer=1,
            q=2,
            head=0,
            present=1,
            slide="block",
        ),
    )
    wait_until(driver, lambda d: "The block" in where(d))
    for title, state, px in walk(driver):
        if "The block" in title:
            assert "block-section" in state["parts"], state
        assert_fits(f"{title} at {size}", state)
        assert_projector_text(f"{title} at {size}", px)
    assert "residual stream" in where(driver)


def test_a_small_slide_is_zoomed_up_on_a_large_screen(driver, server, console):
    screen(driver, 1920, 1080)
    open_page(
        driver, server, fragment(sentence=SENTENCES[3], d_model=24, num_heads=4, q=1, head=0, present=1, slide="scores")
    )
    wait_until(driver, lambda d: "Score" in where(d))
    state = fit(driver)
    assert_fits("3 tokens at 1920x1080", state)
    assert state["zoom"] > 1.1, state
    number = js(
        driver,
        """const c = document.querySelector('figure.heatmap[data-stage="scores"] td');
        return parseFloat(getComputedStyle(c).fontSize) * Number(document.documentElement.dataset.presentZoom);""",
    )
    assert number >= 20, number  # was 15.6 px at 1920×1080


# ---------------------------------------------------------------- the head-size card


def card(driver) -> dict:
    return js(
        driver,
        """const t = (id) => document.getElementById(id).textContent.replace(/\\s+/g, ' ').trim();
        const lines = [...document.querySelectorAll('.facts dd')].filter((dd) => dd.offsetParent !== null)
          .map((dd) => Math.round(dd.getBoundingClientRect().height / parseFloat(getComputedStyle(dd).lineHeight)));
        return { matrices: t('fact-matrices'), matricesLabel: t('fact-matrices-label'), params: t('fact-params'),
                 paramsLabel: document.querySelector('#fact-params-label .visually-hidden')?.textContent || t('fact-params-label'),
                 stackShown: !document.getElementById('fact-stack').hidden, stack: t('fact-stack-label') + ' = ' + t('fact-stack-value'), lines };""",
    )


def thousands(n: int) -> str:
    return f"{n:,}"


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(
    "body, per_layer",
    [
        # the reported card: GPT-2, 3 layers, d_model 24 read "3h + 1 = 45" and "4·d_model² = 21,072"
        (
            {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "block": "gpt2", "num_layers": 3},
            ("3h + 1", 4, "4·d_model²", 24 * 24 * 4),
        ),
        # K/V heads in a stack: h + 2·kv + 1 = 13, 2·48² + 2·2·6·48 = 5,760 a layer
        (
            {
                "sentence": "the cat sat on the mat",
                "d_model": 48,
                "num_heads": 8,
                "num_kv_heads": 2,
                "block": "llama",
                "num_layers": 2,
            },
            ("h + 2·kv + 1", 13, "2·d_model² + 2·kv·d_k·d_model", 2 * 48 * 48 + 2 * 2 * 6 * 48),
        ),
    ],
)
def test_the_head_size_card_shows_one_layers_formulas_and_numbers_and_the_stacks_totals(
    driver, server, console, tmp_path, size, body, per_layer
):
    screen(driver, *size)
    label, matrices, params_label, params = per_layer
    cfg = requests.post(server.url + "/trace", json=body, timeout=30).json()["config"]
    view = {
        "sentence": body["sentence"],
        "d_model": body["d_model"],
        "num_heads": body["num_heads"],
        "block": body["block"],
        "layers": body["num_layers"],
        "causal": 1,
        "q": 1,
        "head": 0,
    }
    if "num_kv_heads" in body:
        view["kv"] = body["num_kv_heads"]
        view["pe"] = "rope"
    open_page(driver, server, fragment(**view))
    wait_until(driver, lambda d: card(d)["stackShown"])
    page = tmp_path / "card.html"
    page.write_bytes(requests.post(server.url + "/trace/html", json=body, timeout=30).content)
    for where_ in ("page", "saved page"):
        if where_ == "saved page":
            driver.get("about:blank")
            driver.get(page.as_uri())
            wait_until(driver, lambda d: card(d)["stackShown"])
        got = card(driver)
        assert (got["matricesLabel"], got["matrices"], got["paramsLabel"], got["params"]) == (
            label,
            str(matrices),
            params_label,
            thousands(params),
        ), (where_, got)
        layers = body["num_layers"]
        assert got["stack"] == (
            f"The whole stack ({layers} layers, with FFN and norms) = "
            f"{thousands(cfg['n_matrices'])} matrices, {thousands(cfg['n_parameters'])} weights"
        ), got
        assert cfg["n_parameters"] != params and all(n == 1 for n in got["lines"][:3]), (where_, got)


# ---------------------------------------------------------------- the projector text scale


def text_px(driver) -> dict:
    """The smallest map or matrix number (the residual stream's too, and the √d_k comparison's weights, entropy and
    max weight) and figure caption on screen, in screen pixels (font size × the zoom); None when the screen shows
    none."""
    return js(
        driver,
        """const z = Number(document.documentElement.dataset.presentZoom || 1);
        const px = (sel) => [...document.querySelectorAll(sel)].filter((e) => e.offsetParent && e.textContent.trim())
          .map((e) => parseFloat(getComputedStyle(e).fontSize) * z);
        const least = (sel) => { const all = px(sel); return all.length ? Math.min(...all) : null; };
        return { numbers: least('#results .hm-cell, #results .mx-cell, #results .rs-cell, #results .compare-table .num'),
                 captions: least('#results figcaption, #results .mx-caption, #walkthrough-title'),
                 root: parseFloat(getComputedStyle(document.documentElement).fontSize) };""",
    )


@pytest.mark.parametrize("n", [3, 6])
def test_present_mode_at_1280x720_draws_a_maps_numbers_at_16_px_and_its_caption_at_20(driver, server, console, n):
    screen(driver, 1280, 720)
    open_page(
        driver,
        server,
        fragment(
            sentence=SENTENCES[n], d_model=24, num_heads=4, causal=1, q=1, head=0, present=1, slide="masked_scores"
        ),
    )
    wait_until(driver, lambda d: "Mask" in where(d))
    assert_fits(f"{n} tokens", fit(driver))
    got = text_px(driver)
    assert got["numbers"] >= 16 and got["captions"] >= 20, got


def test_a_busy_stage_keeps_its_figure_in_the_address_and_page_up_goes_back_to_the_last_figure(driver, server, console):
    screen(driver, 1280, 720)
    view = dict(sentence=SENTENCES[6], d_model=24, num_heads=4, causal=1, q=1, head=0, present=1)
    # An address from before the figures (slide only): the stage's first figure.
    open_page(driver, server, fragment(**view, slide="scores"))
    wait_until(driver, lambda d: where(d).startswith("Stage 3 of 8: Score: Q·Kᵀ — "))
    assert where(driver).endswith("(1 of 5)") and "part=" not in driver.current_url, where(driver)
    ActionChains(driver).send_keys(Keys.PAGE_DOWN).perform()
    wait_until(driver, lambda d: where(d).endswith("Q (2 of 5)"))
    assert "slide=scores&part=2" in driver.current_url
    # A reload keeps the figure; the figures of the stage shown are the only part on screen.
    address = driver.current_url
    open_page(driver, server, address[address.index("#") :])
    wait_until(driver, lambda d: where(d).endswith("Q (2 of 5)"))
    shown = js(
        driver,
        "return [...document.querySelectorAll('#results table.mx-grid')].filter((t) => t.offsetParent).map((t) => t.dataset.matrix)",
    )
    assert shown == ["Q"], shown
    # An address's figure holds on a stage whose comparison trace arrives after the page is drawn (it fits whole
    # until then): the √d_k comparison, the scale stage's third figure.
    open_page(driver, server, fragment(**view, slide="scaled_scores", part=3))
    wait_until(driver, lambda d: where(d).endswith("(3 of 3)") and "Why divide" in where(d))
    assert "slide=scaled_scores&part=3" in driver.current_url
    # Page Up from the next stage's first step: this stage's last figure, the map.
    open_page(driver, server, fragment(**view, slide="scaled_scores"))
    wait_until(driver, lambda d: where(d).startswith("Stage 4 of 8"))
    ActionChains(driver).send_keys(Keys.PAGE_UP).perform()
    wait_until(driver, lambda d: where(d).endswith("Scores (5 of 5)"))
    assert "slide=scores&part=5" in driver.current_url
    # Out of present mode every figure is back, the page as it was.
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    wait_until(driver, lambda d: "present=" not in d.current_url)
    assert (
        js(driver, "return document.querySelectorAll('.present-aside, .present-cut, .present-slice-note').length") == 0
    )
    assert (
        len(js(driver, "return [...document.querySelectorAll('#results table.mx-grid')].filter((t) => t.offsetParent)"))
        == 3
    )


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_table_too_wide_even_alone_is_cut_to_what_fits_with_a_note_never_shrunk(driver, server, console, size):
    """A 12-layer stack's residual stream (12 tokens × 13 depths) does not fit at 16 px: its first depths and tokens
    are shown at 16 px, and a note says which; out of present mode the page has the whole table."""
    screen(driver, *size)
    view = dict(
        sentence=SENTENCES[12], d_model=24, num_heads=2, causal=1, block="gpt2", layers=12, layer=1, q=1, head=0
    )
    open_page(driver, server, fragment(**view, present=1, slide="residual"))
    wait_until(driver, lambda d: "residual stream" in where(d))
    assert_fits(f"residual at {size}", fit(driver))
    px = text_px(driver)
    assert 16 <= px["numbers"] < 17, px
    cut = js(
        driver,
        """const t = document.querySelector('.residual-table');
        return { depths: [...t.tHead.rows[0].cells].filter((c) => c.offsetParent).length - 1,
                 tokens: [...t.tBodies[0].rows].filter((r) => r.offsetParent).length,
                 note: document.querySelector('.present-slice-note')?.textContent || '' };""",
    )
    assert 1 <= cut["depths"] < 13 and cut["tokens"] >= 1, cut
    assert cut["note"].startswith(f"Showing depths 1–{cut['depths']} of 13"), cut
    if cut["tokens"] < 12:
        assert f"tokens 1–{cut['tokens']} of 12" in cut["note"], cut
    assert "the full table is in the page" in cut["note"], cut
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    wait_until(driver, lambda d: "present=" not in d.current_url)
    assert js(driver, "return document.querySelectorAll('.residual-table td.rs-cell').length") == 12 * 13
    assert js(
        driver, "return [...document.querySelectorAll('.residual-table td.rs-cell')].every((c) => c.offsetParent)"
    )


def test_the_text_scale_is_kept_in_the_address_and_the_saved_page(driver, server, console, tmp_path):
    screen(driver, 1280, 720)
    open_page(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=1, q=1, head=0))
    wait_until(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#maps-body td") is not None)
    base = text_px(driver)["root"]
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "text-scale")).select_by_visible_text("150%")
    wait_until(driver, lambda d: "text=150" in d.current_url)
    assert text_px(driver)["root"] == pytest.approx(1.5 * base)
    # A reload keeps it; so does a saved page opened with the address's view.
    address = driver.current_url
    open_page(driver, server, address[address.index("#") :])
    assert driver.find_element(By.ID, "text-scale").get_attribute("value") == "1.5"
    assert text_px(driver)["root"] == pytest.approx(1.5 * base)
    page = tmp_path / "saved.html"
    page.write_bytes(requests.post(server.url + "/trace/html", json={"sentence": "the cat sat"}, timeout=30).content)
    driver.get("about:blank")
    driver.get(page.as_uri() + "#q=1&head=0&text=200")
    wait_until(driver, lambda d: d.find_element(By.ID, "text-scale").get_attribute("value") == "2")
    assert text_px(driver)["root"] == pytest.approx(2 * base)
    Select(driver.find_element(By.ID, "text-scale")).select_by_visible_text("125%")
    wait_until(driver, lambda d: "text=125" in d.current_url)


# ---------------------------------------------------------------- the small items


CONTRAST_JS = """
    const lum = (rgb) => rgb.map((c) => c / 255).map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4))
      .reduce((s, c, i) => s + c * [0.2126, 0.7152, 0.0722][i], 0);
    const hex = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
    const rgbOf = (css) => css.match(/[\\d.]+/g).slice(0, 3).map(Number);
    const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
    const F = globalThis.AttentionTrace.format;
    return [...document.querySelectorAll(arguments[0])].filter((el) => el.offsetParent !== null).map((el) => {
      const t = Number(el.style.getPropertyValue('--t'));
      return ratio(hex(F.scaleColour(t)), rgbOf(getComputedStyle(el).color));
    });"""


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_small_items(driver, server, console, size):
    """The residual stream's cells hold 4.5:1; the Llama diagram names RMSNorm; the Block select shows its whole
    choice; each "all N values" expander has a name of its own."""
    screen(driver, *size)
    open_page(
        driver,
        server,
        fragment(
            sentence="the cat sat on the mat",
            d_model=32,
            num_heads=2,
            block="llama",
            layers=3,
            causal=1,
            pe="rope",
            q=1,
            head=0,
        ),
    )
    wait_until(driver, lambda d: js(d, "return document.querySelectorAll('.rs-cell').length") == 6 * 4)
    ratios = js(driver, CONTRAST_JS, ".rs-cell")
    assert len(ratios) == 24 and min(ratios) >= 4.5, sorted(ratios)[:3]
    details = js(driver, "return [...document.querySelectorAll('.bd-detail')].map((t) => t.textContent)")
    assert "2 heads · reads RMSNorm₁(x)" in details and not any("LN₁" in d and "RMSNorm" not in d for d in details)
    # The Block select: its chosen option's text fits inside it (a hidden twin measures the text in its font).
    for value in ("gpt2", "vaswani2017", "llama"):
        fits = js(
            driver,
            """const sel = document.getElementById('block'); sel.value = arguments[0];
            const probe = document.createElement('span'); const cs = getComputedStyle(sel);
            probe.style.font = cs.font; probe.style.position = 'absolute'; probe.style.visibility = 'hidden';
            probe.style.whiteSpace = 'nowrap'; probe.textContent = sel.selectedOptions[0].text; document.body.append(probe);
            const need = probe.getBoundingClientRect().width + parseFloat(cs.paddingLeft) + 24; probe.remove();
            return [need, sel.clientWidth];""",
            value,
        )
        assert fits[0] <= fits[1], (value, fits)
    names = js(
        driver,
        """return [...document.querySelectorAll('#walkthrough summary')].filter((s) => /^all \\d+ values$/.test(s.textContent))
        .map((s) => s.getAttribute('aria-label'));""",
    )
    assert len(names) >= 3 and len(set(names)) == len(names) and all(n and n.startswith("all ") for n in names), [
        n for n in names if names.count(n) > 1
    ]


# ---------------------------------------------------------------- long sentences


def long_sentence(n: int) -> str:
    words = "the cat sat on a mat while it rained and every dog in town ran after one red ball".split()
    return " ".join(words[i % len(words)] for i in range(n))


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n", [30, 60])
def test_a_long_sentence_is_coloured_by_default_and_its_query_is_in_view(driver, server, console, size, n):
    """The default scale is each row's largest above 12 tokens (0 … 1 left 810 of 900 cells near-white at 30 tokens),
    said in the legend; the query token chosen in the address is scrolled into its bar; a cap is explained."""
    screen(driver, *size)
    q = n - 3
    open_page(driver, server, fragment(sentence=long_sentence(n), d_model=24, num_heads=1, q=q, head=0))
    wait_until(
        driver,
        lambda d: js(d, "return document.querySelectorAll('table[data-stage=\"weights\"] td.hm-cell').length") > 0,
    )
    t = js(
        driver,
        """return [...document.querySelectorAll('table[data-stage="weights"] td.hm-cell:not(.is-masked)')]
        .map((td) => Number(td.style.getPropertyValue('--t')));""",
    )
    coloured = sum(v >= 0.15 for v in t)
    assert coloured > 0.6 * len(t), (coloured, len(t))  # absolute 0 … 1: 90 of 900 at 30 tokens
    legend = js(
        driver,
        "const l = document.querySelector('figure[data-stage=\"weights\"] .legend');"
        "return [l.dataset.mode, l.dataset.auto, l.textContent];",
    )
    assert legend[:2] == ["row", "true"] and f"chosen for {min(n, 48)} tokens" in legend[2], legend
    chip = js(
        driver,
        """const bar = document.getElementById('token-options').getBoundingClientRect();
        const c = document.querySelector('#token-options input:checked').closest('.chip').getBoundingClientRect();
        return [c.left >= bar.left - 1, c.right <= bar.right + 1, Number(document.querySelector('#token-options input:checked').value)];""",
    )
    assert chip == [True, True, q], chip
    if n > 48:
        cap = driver.find_element(By.CSS_SELECTOR, "#maps-body .hm-cap").text
        assert "first 48 of 60" in cap and "10 px" in cap, cap


# ---------------------------------------------------------------- the shared link


def test_the_shared_link_keeps_the_clicked_cell(driver, server, console):
    screen(driver, 1280, 720)
    open_page(
        driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=1, head=2)
    )
    cell = 'table[data-stage="weights"] td[data-row="3"][data-col="1"]'
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, cell))
    driver.find_element(By.CSS_SELECTOR, cell).click()
    wait_until(driver, lambda d: "key=1" in d.current_url and "q=3" in d.current_url)
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#explain-body table"))
    shown = driver.find_element(By.ID, "explain-body").text
    address = driver.current_url
    open_page(driver, server, address[address.index("#") :])
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#explain-body table"))
    assert driver.find_element(By.ID, "explain-body").text == shown
    assert "is-explained" in driver.find_element(By.CSS_SELECTOR, cell).get_attribute("class")
    assert "key=1" in driver.current_url


def test_the_print_stylesheet_makes_a_handout(driver, server, console):
    screen(driver, 1280, 720)
    open_page(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=2, q=1, head=0))
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'table[data-stage="weights"] td'))
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        shown = js(
            driver,
            """const on = (s) => [...document.querySelectorAll(s)].some((e) => e.offsetParent !== null
            || getComputedStyle(e).display !== 'none' && e.getClientRects().length > 0);
            return { sidebar: on('.sidebar'), buttons: on('#results .button'), pickers: on('.picker-bar'),
                     maps: on('figure.heatmap'), walkthrough: on('#walkthrough'),
                     exact: getComputedStyle(document.querySelector('td.hm-cell')).printColorAdjust };""",
        )
        assert shown == {
            "sidebar": False,
            "buttons": False,
            "pickers": False,
            "maps": True,
            "walkthrough": True,
            "exact": "exact",
        }, shown
    finally:
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})


@pytest.mark.parametrize("size", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_tall_maps_column_labels_stay_in_view(driver, server, console, size):
    screen(driver, *size)
    open_page(driver, server, fragment(sentence=long_sentence(60), d_model=24, num_heads=1, q=1, head=0))
    box = 'figure[data-stage="weights"] .hm-scroll'
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, box))
    got = js(
        driver,
        """const box = document.querySelector(arguments[0]);
        box.scrollIntoView({ block: 'start' }); box.scrollTop = box.scrollHeight;
        const b = box.getBoundingClientRect();
        const label = box.querySelector('thead th.hm-col:nth-child(5)').getBoundingClientRect();
        const last = box.querySelector('tbody tr:last-child').getBoundingClientRect();
        return { scrolled: box.scrollTop > 0, boxTop: b.top, boxBottom: b.bottom, labelTop: label.top,
                 labelBottom: label.bottom, lastBottom: last.bottom, height: innerHeight };""",
        box,
    )
    assert got["scrolled"] and got["boxBottom"] - got["boxTop"] <= got["height"], got
    assert got["boxTop"] - 1 <= got["labelTop"] and got["labelBottom"] <= got["boxTop"] + 120, got  # stuck at the top
    assert got["lastBottom"] <= got["boxBottom"] + 1, got  # the last row reached under the labels


# ---------------------------------------------------------------- figures for slides


def test_a_map_and_the_comparison_download_as_png_at_twice_their_svg(driver, server, console, browser_dirs):
    import re as _re

    from viewer_browser_support import clear_downloads, wait_download

    screen(driver, 1280, 720)
    downloads = clear_downloads(browser_dirs)
    open_page(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=2, q=1, head=0))
    wait_until(driver, lambda d: not d.find_element(By.ID, "download-saturation-png").get_attribute("disabled"))
    for svg_button, png_button, pattern in (
        ('button[data-svg="weights"]', 'button[data-png="weights"]', "*_weights_head0"),
        ("#download-saturation-svg", "#download-saturation-png", "*_comparison_q1_head0"),
    ):
        driver.find_element(By.CSS_SELECTOR, svg_button).click()
        svg = wait_download(downloads, f"{pattern}.svg").read_text(encoding="utf-8")
        driver.find_element(By.CSS_SELECTOR, png_button).click()
        png = wait_download(downloads, f"{pattern}.png")
        head = svg[: svg.index(">", svg.index("<svg"))]
        w, h = (float(_re.search(rf'\s{a}="([\d.]+)"', head).group(1)) for a in ("width", "height"))
        assert png_size(png) == (round(2 * w), round(2 * h)), (pattern, png_size(png), w, h)
        assert "the cat sat" in svg  # the sentence on the figure


# ---------------------------------------------------------------- themes


TEXT_CONTRAST_JS = """
    const lum = (rgb) => rgb.map((c) => c / 255).map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4))
      .reduce((s, c, i) => s + c * [0.2126, 0.7152, 0.0722][i], 0);
    const rgba = (css) => { const m = css.match(/^rgba?\\(([^)]*)\\)$/); if (!m) return null;
      const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
    const background = (el) => {
      for (let e = el; e; e = e.parentElement) {
        const cs = getComputedStyle(e);
        if (cs.backgroundImage !== 'none') return null; // a gradient or hatch: not a flat colour
        const c = rgba(cs.backgroundColor);
        if (c === null) return null; // a colour-mixed cell: its own ink is tested elsewhere
        if (c[3] > 0.99) return c.slice(0, 3);
        if (c[3] > 0.01) return null;
      }
      return [255, 255, 255];
    };
    const out = [];
    const visible = (el) => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden'
      && !el.closest('.visually-hidden, [aria-hidden="true"], :disabled, .is-stale, .hm-cell, .mx-cell, .thumb-cell, .strip-cell, .rs-cell');
    for (const el of document.querySelectorAll('body *')) {
      if (!visible(el) || ![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
      const cs = getComputedStyle(el);
      if (Number(cs.opacity) < 1) continue;
      const ink = rgba(cs.color); const bg = background(el);
      if (!ink || !bg) continue;
      const [a, b] = [lum(ink.slice(0, 3)), lum(bg)].sort((x, y) => y - x);
      const ratio = (a + 0.05) / (b + 0.05);
      if (ratio < 4.5) out.push([el.tagName + '.' + el.className, el.textContent.trim().slice(0, 30), ratio.toFixed(2), cs.color, bg.join(',')]);
    }
    return out;"""


@pytest.mark.parametrize("theme", ["light", "dark", "contrast", "system-dark"])
def test_every_text_holds_4_5_to_1_in_every_theme(driver, server, console, theme):
    screen(driver, 1280, 720)
    dark_system = theme == "system-dark"
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark" if dark_system else "light"}]},
    )
    try:
        view = dict(
            sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=1, head=0, block="gpt2", layers=2
        )
        if not dark_system:
            view["theme"] = theme
        open_page(driver, server, fragment(**view))
        wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'table[data-stage="weights"] td'))
        want = "dark" if dark_system else theme
        assert driver.find_element(By.ID, "theme").get_attribute("value") == ("system" if dark_system else theme)
        surface = js(driver, "return getComputedStyle(document.querySelector('.panel')).backgroundColor")
        assert (surface != "rgb(255, 255, 255)") == (want == "dark"), surface
        bad = js(driver, TEXT_CONTRAST_JS)
        assert bad == [], bad[:8]
    finally:
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_the_block_diagram_downloads_as_svg_and_png(driver, server, console, browser_dirs):
    from xml.etree import ElementTree

    from viewer_browser_support import clear_downloads, wait_download

    screen(driver, 1280, 720)
    downloads = clear_downloads(browser_dirs)
    open_page(
        driver,
        server,
        fragment(
            sentence="the cat sat", d_model=24, num_heads=2, block="gpt2", layers=2, layer=1, causal=1, q=1, head=0
        ),
    )
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#block-diagram svg"))
    driver.find_element(By.ID, "download-block-svg").click()
    svg = wait_download(downloads, "*_block_layer1.svg").read_text(encoding="utf-8")
    root = ElementTree.fromstring(svg.encode())
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "“the cat sat”" in texts and any(t.startswith("The block · layer 1 of 2") for t in texts), texts[:4]
    assert any("reads LN₁(x)" in t for t in texts)
    driver.find_element(By.ID, "download-block-png").click()
    png = wait_download(downloads, "*_block_layer1.png")
    assert png_size(png) == (2 * int(float(root.get("width"))), 2 * int(float(root.get("height"))))
