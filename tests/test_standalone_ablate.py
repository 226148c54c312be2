"""The offline handout of an ablated request: /trace/html's page, opened from disk in a Chromium that cannot reach
any network, shows the intervened maps and the "Compared with the baseline" panel, as /trace answers them (a module
of its own: the offline browser needs its own profile, apart from tests/test_viewer_ablate_browser.py's)."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from test_standalone import dirs, offline, open_file, save_page  # noqa: F401 (dirs, offline: its fixtures)
from test_viewer_ablate_browser import ABLATED, panel_rows
from test_viewer_heads_browser import same_cells
from viewer_browser_support import wait_until

pytestmark = [pytest.mark.browser]


def test_the_offline_handout_shows_the_ablation(client, offline, dirs):  # noqa: F811 (the imported fixtures)
    path, resp, _ = save_page(client, dirs, ABLATED)
    doc = resp.get_json()
    watch = open_file(offline, path, "#layer=1")
    wait_until(offline, lambda d: d.find_element(By.ID, "intervention").is_displayed())
    rows = panel_rows(offline)
    assert rows["context"] == " · ".join(f"{x:.4f}" for x in doc["intervention"]["max_abs_delta"]["context"])
    wait_until(offline, lambda d: same_cells(d, doc["stages"]["weights"]["values"][1][0]))
    watch.check()
