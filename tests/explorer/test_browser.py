"""The explorer as a reader opens it: the Voilà app in headless Chromium (Selenium) on the smoke run.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); skipped, with that
reason, only where they cannot be found and ``CROPCOP_REQUIRE_BROWSER`` is unset: CI sets it, and there a
missing browser fails the test like a page that does not work.  The server is bounded (start, cell and
wait time limits) and stopped by ``explorer_app.serving`` when the test ends, pass or fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cropcop_utils.explorer import app as explorer_app
from cropcop_utils.explorer import logic as explorer

REQUIRE_BROWSER = "CROPCOP_REQUIRE_BROWSER"  # set (not "0") by .ci/run: no skip, a missing browser fails
PAGE_TIMEOUT_S = 300  # Voilà starts a kernel and runs the notebook (verified reads) before the widgets show
# Chromium as root in a container: no sandbox, no GPU, no /dev/shm, nothing that reaches the network.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--window-size=1400,2400")


@contextmanager
def chromium(profile_dir: Path) -> Iterator:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not binary or not driver_path:
        reason = ("headless Chromium is not installed (Debian: apt-get install -y chromium "
                  "chromium-driver; .ci/run installs them)")
        if os.environ.get(REQUIRE_BROWSER, "") not in ("", "0"):
            pytest.fail(f"{reason}, and {REQUIRE_BROWSER} is set: the explorer's page must be checked here")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}"):
        options.add_argument(flag)
    # an explicit driver path: Selenium Manager would otherwise try to download one
    service = Service(executable_path=driver_path, log_output=str(profile_dir.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_page_load_timeout(PAGE_TIMEOUT_S)
        yield driver
    finally:
        driver.quit()


def busiest_other_class(data: explorer.ExplorerData, state: str) -> int:
    """The class, other than the first, with the most ``state`` errors: the view must change visibly."""
    counts = {label: len(explorer.misclassified(data, label, state)) for label in data.classes["label"]
              if label != data.first_class}
    label = max(counts, key=lambda k: (counts[k], -k))
    assert counts[label] > 0, f"the {state} makes no error outside the first class; nothing to click to"
    return int(label)


def open_pick_and_check(run_dir: Path, folder: Path, state: str = "pte", max_images: int = 12) -> Path:
    """Serve the explorer, pick another class, check its view, click a thumbnail; the screenshot path."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    data = explorer.load(run_dir)
    state = state if state in data.states else data.states[-1]
    target = busiest_other_class(data, state)
    errors = explorer.misclassified(data, target, state)
    options = dict((label, text) for text, label in explorer.class_options(data, state))
    screenshot = folder / "explorer.png"

    app = explorer_app.serving(run_dir, state=state, max_images=max_images, log_path=folder / "voila.log")
    with app as server, chromium(folder / "chromium") as driver:
        wait = WebDriverWait(driver, PAGE_TIMEOUT_S)
        driver.get(server.url)
        tables = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".cropcop-tables"))
        wait.until(lambda d: tables.text.startswith(data.name(data.first_class)))

        Select(driver.find_element(By.CSS_SELECTOR, ".cropcop-class select")).select_by_visible_text(
            options[target])  # what a reader does: pick another class in the drop-down
        wait.until(lambda d: tables.text.startswith(data.name(target)))

        first_row = driver.find_element(By.CSS_SELECTOR, ".cropcop-confusion tbody tr th")
        assert first_row.text == data.name(target)  # its confusion row starts with the class itself
        assert f"{len(errors)} test rows misclassified" in tables.text

        def target_thumbnails(d):  # the gallery is redrawn by its own message, after the tables
            found = d.find_elements(By.CSS_SELECTOR, ".cropcop-gallery figure.cropcop-thumb")
            shown = {f.get_attribute("data-true-class") for f in found}
            return found if shown == {data.name(target)} else False

        thumbs = wait.until(target_thumbnails)
        assert len(thumbs) == min(max_images, len(errors))
        assert [t.get_attribute("data-row-id") for t in thumbs] == list(errors["row_id"].head(max_images))
        assert errors["path"].iloc[0] in thumbs[0].text  # the file path, readable under the image
        image = thumbs[0].find_element(By.TAG_NAME, "img")
        small = image.size["width"]
        thumbs[0].find_element(By.TAG_NAME, "summary").click()  # click to enlarge
        wait.until(lambda d: image.size["width"] > small)
        assert thumbs[0].find_element(By.TAG_NAME, "details").get_attribute("open") is not None
        driver.save_screenshot(str(screenshot))

        # the filter a reader reaches for next: the rows other classes lost to this one
        came_in = explorer.misclassified(data, target, state, by="pred")
        driver.find_element(By.XPATH, "//*[contains(@class, 'cropcop-by')]"
                                      "//button[normalize-space()='predicted class']").click()
        wait.until(lambda d: f"{len(came_in)} test rows of other classes" in tables.text)
        header = driver.find_element(By.CSS_SELECTOR, ".cropcop-confusion thead tr:last-child th")
        assert header.text == "true class"
        expected = min(max_images, len(came_in))
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".cropcop-thumb")) == expected
                   and (expected or d.find_elements(By.CSS_SELECTOR, ".cropcop-gallery-empty")))
        driver.save_screenshot(str(folder / "explorer_predicted.png"))
    assert server.process.poll() is not None, "the explorer's server outlived the test"
    return screenshot


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the session's smoke book may be built first, inside this test's time
def test_reader_picks_a_class_in_the_browser(smoke_book, tmp_path: Path) -> None:
    screenshot = open_pick_and_check(Path(smoke_book["run_dir"]), tmp_path)
    assert screenshot.read_bytes().startswith(b"\x89PNG")


def test_a_missing_browser_fails_where_it_is_required(monkeypatch, tmp_path: Path) -> None:
    """A developer's machine without Chromium skips; CI (which installs it) fails instead of skipping."""
    def outcome() -> str:  # caught here: a skip escaping this test would only skip it, not fail it
        try:
            with chromium(tmp_path):
                return "ran"
        except pytest.skip.Exception:
            return "skipped"
        except pytest.fail.Exception as failure:
            return "failed" if REQUIRE_BROWSER in str(failure) else f"failed otherwise: {failure}"

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(REQUIRE_BROWSER, raising=False)
    assert outcome() == "skipped"
    monkeypatch.setenv(REQUIRE_BROWSER, "1")
    assert outcome() == "failed"


def test_ci_requires_the_browser() -> None:
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert f"{REQUIRE_BROWSER}=1 make test" in ci, "CI must run the suite with the browser test required"
