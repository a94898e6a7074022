"""The status page in a real headless Chromium (Debian's chromium + chromium-driver, driven by
selenium): it refreshes itself from /status.json and shows /workers' numbers; screenshots at
1280x800 and at phone width are written under the test's tmp dir for humans.

Skipped, with the reason, when selenium, chromium or chromedriver is missing
(`apt-get install chromium chromium-driver`; `pip install selenium`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.helpers.route_live import LiveRoute, as_number

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - depends on the machine
    webdriver = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(
        webdriver is None or CHROMIUM is None or DRIVER is None,
        reason="needs selenium (pip install selenium) and Debian's chromium + chromium-driver "
        f"(apt-get install chromium chromium-driver); found selenium={webdriver is not None}, "
        f"chromium={CHROMIUM}, chromedriver={DRIVER}",
    ),
    pytest.mark.slow,
    pytest.mark.subprocess,
]


@pytest.fixture
def browser(tmp_path: Path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM  # type: ignore[assignment]
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,800",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _page_rows(driver) -> dict[tuple[str, str], dict[str, str]]:
    rows = {}
    for tr in driver.find_elements(By.CSS_SELECTOR, "#workers tbody tr[data-worker]"):
        cells = {c.get_attribute("data-k"): c.text for c in tr.find_elements(By.CSS_SELECTOR, "[data-k]")}
        rows[(tr.get_attribute("data-worker"), tr.get_attribute("data-rank"))] = cells
    return rows


def _wait_refreshes(driver, n: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed") or 0) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"the page did not refresh {n} time(s): {driver.find_element(By.ID, 'updated').text}")


def test_page_refreshes_and_matches_workers(browser, tmp_path: Path):
    with LiveRoute(rate=30) as live:
        live.wait_ready()
        live.score_requests(30)
        t0 = time.monotonic()
        browser.get(f"http://{live.host}:{live.port}/")
        _wait_refreshes(browser, 1)
        first_refresh_s = time.monotonic() - t0
        live.service.feed.stop()  # freeze the index (serve keeps publishing, nobody listens) to compare exactly
        _wait_refreshes(browser, int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed")) + 1)
        workers = live.get_json("/workers")["workers"]
        status = live.get_json("/status.json")
        rows = _page_rows(browser)
        assert {(w["worker"], str(w["dp_rank"])) for w in workers} == set(rows)
        for w in workers:
            row = rows[(w["worker"], str(w["dp_rank"]))]
            assert as_number(row["blocks"]) == w["blocks"]
            assert as_number(row["last_seq"]) == w["last_seq"]
            for medium, n in w["blocks_by_medium"].items():
                assert as_number(row[f"medium:{medium}"]) == n
            assert row["state"] in ("healthy", "stale", "repairing")
        total = browser.find_element(By.CSS_SELECTOR, "[data-k=requests_total]").text
        assert as_number(total) == status["score"]["requests_total"] == 30
        bars = browser.find_elements(By.CSS_SELECTOR, "#matched .bar")
        assert sum(as_number(b.find_element(By.CLASS_NAME, "n").text) or 0 for b in bars) == 30
        assert browser.find_elements(By.CSS_SELECTOR, "#sources tr[data-source]")
        logs = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        assert not logs, logs  # no script error, no blocked (external) request
        browser.save_screenshot(str(tmp_path / "status-1280x800.png"))
        browser.set_window_size(390, 844)  # a phone
        time.sleep(0.3)
        width = browser.execute_script("return document.documentElement.scrollWidth")
        browser.save_screenshot(str(tmp_path / "status-phone.png"))
        assert width <= 400, f"the page scrolls sideways on a phone: {width}px"  # wide tables scroll in their box
        print(f"first refresh after {first_refresh_s:.2f}s; screenshots in {tmp_path}")
