"""The highlighting page in a real headless Chromium against a real uvicorn server on the English model.

Set ``PAGE_SCREENSHOT_DIR`` to keep the screenshots outside pytest's temporary folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import SHIPPED_EN
from tests.local_services import live_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TEXT = "Angela Merkel met Emmanuel Macron in Paris ."
#: Characters of two UTF-16 units (emoji), flags (pairs of regional indicators), skin-tone
#: modifiers and a ZWJ sequence before the entities: the API counts code points, JavaScript
#: strings UTF-16 units.
EMOJI_TEXT = "😀🎉 Barack Obama met 🇫🇷🇩🇪 Angela Merkel and 👍🏽👩🏿‍💻 Emmanuel Macron in 🇬🇧 London ."

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
                       reason="needs /usr/bin/chromium and /usr/bin/chromedriver (apt-get install -y chromium chromium-driver)"),
    pytest.mark.skipif(not SHIPPED_EN.is_file(), reason="the shipped en-conll03 model is not in this checkout"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app under uvicorn on a free loopback port, ready on en-conll03; its base URL."""
    env = {"NER_MODEL": "en-conll03", "NER_API_KEYS": "", "NER_REQUEST_TIMEOUT_S": "300"}
    with live_server(env, tmp_path_factory.mktemp("server") / "uvicorn.log") as url:
        yield url


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("PAGE_SCREENSHOT_DIR"):
        keep = Path(os.environ["PAGE_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, keep / name)
    return path


def _submit(driver, strategy: str, labels: set[str]) -> str:
    """Pick ``strategy`` and ``labels``, submit, and wait for the new timing line; return it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    Select(driver.find_element(By.ID, "strategy")).select_by_value(strategy)
    for box in driver.find_elements(By.CSS_SELECTOR, "input[name=label]"):
        if box.is_selected() != (box.get_attribute("value") in labels):
            box.click()
    before = driver.find_element(By.ID, "timing").text
    driver.find_element(By.ID, "submit").click()
    WebDriverWait(driver, 120).until(
        lambda d: d.find_element(By.ID, "timing").text not in ("", before) or d.find_element(By.ID, "error").text
    )
    assert driver.find_element(By.ID, "error").text == ""
    return driver.find_element(By.ID, "timing").text


def _highlights(driver) -> list[tuple[str, str]]:
    from selenium.webdriver.common.by import By

    marks = driver.find_elements(By.CSS_SELECTOR, "#result mark.entity")
    return [(TEXT[int(m.get_attribute("data-start")):int(m.get_attribute("data-end"))], m.get_attribute("data-label")) for m in marks]


def test_the_page_highlights_entities_in_chromium(server: str, browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    assert "en-conll03" in browser.find_element(By.ID, "model").text
    browser.find_element(By.ID, "text").send_keys(TEXT)

    timing = _submit(browser, "padellm", {"LOC", "MISC", "ORG", "PER"})
    assert _highlights(browser) == [("Angela Merkel", "PER"), ("Emmanuel Macron", "PER"), ("Paris", "LOC")]
    assert browser.find_element(By.ID, "result").text.startswith("Angela MerkelPER met Emmanuel MacronPER in ParisLOC")
    legend = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#legend span")]
    assert legend == ["LOC (1)", "MISC (0)", "ORG (0)", "PER (2)"]
    assert timing.startswith("3 entities in ") and " ms (engine " in timing and "forward passes, padellm, en-conll03)" in timing
    _screenshot(browser, tmp_path, "page_padellm.png")

    timing = _submit(browser, "ar", {"PER"})
    assert _highlights(browser) == [("Angela Merkel", "PER"), ("Emmanuel Macron", "PER")]
    assert [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#legend span")] == ["PER (2)"]
    assert timing.startswith("2 entities in ") and "forward passes, ar, en-conll03)" in timing
    _screenshot(browser, tmp_path, "page_ar_per.png")


def test_an_open_label_model_is_asked_the_labels_typed_on_the_page(server: str, browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    Select(browser.find_element(By.ID, "model")).select_by_value("open")
    typed = browser.find_element(By.ID, "own-labels")
    assert typed.get_attribute("value") == "person, organization, location, miscellaneous"  # its default labels
    assert browser.find_elements(By.CSS_SELECTOR, "input[name=label]") == []
    typed.clear()
    typed.send_keys("person, city ,, ")
    browser.find_element(By.ID, "text").send_keys(TEXT)
    timing = _submit(browser, "padellm", set())
    assert _highlights(browser) == [("Angela Merkel", "person"), ("Emmanuel Macron", "person"), ("Paris", "city")]
    assert [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#legend span")] == ["city (1)", "person (2)"]
    assert "forward passes, padellm, open)" in timing
    assert browser.find_element(By.ID, "note").text == ""  # names it trained on
    _screenshot(browser, tmp_path, "page_open_labels.png")
    typed.clear()
    typed.send_keys("person, weapon")
    _submit(browser, "padellm", set())
    assert browser.find_element(By.ID, "note").text.startswith('open never trained on "weapon": it finds such types far less often; where a name it trained on fits')


def _rendered(driver) -> tuple[list[tuple[str, str]], str]:
    """The highlighted texts with their labels, and the whole text shown (without the label tags)."""
    marks, shown = driver.execute_script("""
        const result = document.getElementById("result");
        const marks = [...result.querySelectorAll("mark.entity")].map((m) => [m.firstChild.textContent, m.dataset.label]);
        const shown = result.cloneNode(true);
        shown.querySelectorAll(".tag").forEach((tag) => tag.remove());
        return [marks, shown.textContent];
    """)
    return [(text, label) for text, label in marks], shown


def test_the_page_highlights_the_entities_after_emoji_flags_and_skin_tones(server: str, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    labels = ["LOC", "MISC", "ORG", "PER"]
    answer = httpx.post(server + "/v1/entities", json={"text": EMOJI_TEXT, "labels": labels}, timeout=300)
    entities = answer.json()["results"][0]["entities"]
    found = [(e["text"], e["label"]) for e in entities]
    assert ("Barack Obama", "PER") in found and ("Emmanuel Macron", "PER") in found and ("London", "LOC") in found, found
    assert all(EMOJI_TEXT[e["start"]:e["end"]] == e["text"] for e in entities)  # the API's offsets count code points

    browser.get(server + "/")
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    # chromedriver types only the Basic Multilingual Plane: the text is set as a paste would
    browser.execute_script("arguments[0].value = arguments[1]", browser.find_element(By.ID, "text"), EMOJI_TEXT)
    _submit(browser, "padellm", set(labels))
    marks, shown = _rendered(browser)
    assert marks == found  # each highlight is its entity's text, after every emoji
    assert shown == EMOJI_TEXT  # and the text around them is whole


def test_api_docs_render_offline_from_the_servers_own_assets(server: str, browser) -> None:
    """Swagger UI draws the API's operations with every script and style from the server itself:
    no CDN, so the page works on a machine without internet."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/docs")
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"))
    assert "/v1/entities" in browser.find_element(By.TAG_NAME, "body").text
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert any("/docs-assets/" in url for url in fetched), fetched
    assert all(url.startswith(server) for url in fetched), fetched
