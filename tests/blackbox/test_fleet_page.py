"""The fleet page in a real browser: Debian's chromium, headless, driven
through chromedriver (selenium), against a demo gateway of its own.

The page renders the demo fleet, its replica table fills in, the decision
feed shows the requests this test sends (and a click shows one's whole
record), and a replica stopped through the simulator's fault API turns
stale on the page within seconds. Every wait is bounded and polls what the
page shows; none sleeps blindly.

Screenshots, light and dark, laptop (1366x768) and wide (2560x1440), are
written to target/ui-screenshots/ (INFERGATE_SCREENSHOTS overrides). With
INFERGATE_DOC_SCREENSHOT=1 the test also rewrites docs/img/fleet-page.png.
"""

import os
import shutil
import struct
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("INFERGATE_SCREENSHOTS", ROOT / "target" / "ui-screenshots"))
DOC_IMAGE = ROOT / "docs" / "img" / "fleet-page.png"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-32B"
# How long the page may take to show a change: it polls once a second,
# and the gateway scrapes replicas several times a second.
DEADLINE = 15

NO_BROWSER = "chromium and chromedriver are not installed (apt-get install -y chromium chromium-driver)"
# scripts/test sets this when it could not install them; anywhere else a
# missing browser fails these tests rather than hiding them.
if not (CHROMIUM and CHROMEDRIVER) and os.environ.get("INFERGATE_BROWSER_OPTIONAL") == "1":
    pytest.skip(f"BROWSER TESTS SKIPPED: {NO_BROWSER}", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail(NO_BROWSER, pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--window-size=1366,768",
        "--lang=en-US",
        "--no-first-run",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    viewport(driver, 1366, 768)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(own_gateway, browser):
    """The page, open on the demo's fleet."""
    assert own_gateway.page == f"http://{own_gateway.admin}/", "the demo prints the page's address"
    browser.get(own_gateway.page)
    assert browser.current_url == f"http://{own_gateway.admin}/ui/"
    assert browser.title == "infergate · fleet"
    return browser


def viewport(driver, width, height):
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def color_scheme(driver, scheme):
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )


def until(driver, what, look, timeout=DEADLINE):
    """`look()` once it is truthy, polled every 100 ms for at most
    `timeout` seconds; the failure names `what`."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda _: look(), message=what)


def replicas(driver):
    """Every pool's replica rows as the page shows them."""
    return driver.execute_script(
        """
        const pools = {};
        for (const s of document.querySelectorAll("section.pool")) {
          pools[s.dataset.pool] = [...s.querySelectorAll("tr.replica")].map((r) => ({
            address: r.dataset.address,
            health: r.dataset.health,
            classes: r.className,
            kv: r.querySelector('[data-col="kv"]').innerText.trim(),
            score: r.querySelector('[data-col="score"]').innerText.trim(),
            badge: r.querySelector(".health").innerText.trim(),
          }));
        }
        return pools;
        """
    )


def row_of(driver, pool, address):
    return next((r for r in replicas(driver).get(pool, []) if r["address"] == address), None)


def stat(driver, pool, index):
    """A pool's figure tile (0: ready, 1: queued, 2: requests, 3: TTFT, 4:
    429s, 5: errors): its value and the line under it."""
    return driver.execute_script(
        """
        const tile = document.querySelector(`section.pool[data-pool="${arguments[0]}"] .stat:nth-child(${arguments[1] + 1})`);
        return tile ? [tile.querySelector(".value").innerText, tile.querySelector(".sub").innerText] : null;
        """,
        pool,
        index,
    )


def feed_rows(driver):
    return driver.execute_script(
        """
        return [...document.querySelectorAll("#feed tbody tr")].map((r) => ({
          id: r.dataset.requestId,
          pool: r.dataset.pool,
          shown: !r.classList.contains("hidden"),
          cells: [...r.cells].map((c) => c.innerText.trim()),
        }));
        """
    )


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def chat(gw, request_id, model, stream=False, max_tokens=16, client=None, prompt_words=0):
    words = " ".join(f"w{i}" for i in range(prompt_words))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Say hello ({request_id}) {words}"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    headers = {"x-request-id": request_id}
    c = client or httpx
    if stream:
        with c.stream("POST", f"http://{gw.addr}/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
            for _ in r.iter_bytes():
                pass
            return r.status_code
    return c.post(f"http://{gw.addr}/v1/chat/completions", json=body, headers=headers, timeout=120).status_code


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


# ---------------------------------------------------------------------------


def test_the_replica_table_lists_the_demo_replicas(own_gateway, page):
    want = {pool: sorted(addrs) for pool, addrs in own_gateway.pools.items()}
    # llama-70b starts cold: its replica loads for 45 s, listed meanwhile.
    assert set(want) == {"llama-8b", "qwen-32b", "llama-70b"}
    warm = ("llama-8b", "qwen-32b")

    def filled():
        shown = replicas(page)
        listed = {pool: sorted(r["address"] for r in rows) for pool, rows in shown.items()}
        fresh = all(r["health"] == "fresh" and r["kv"].endswith("%") for pool in warm for r in shown.get(pool, []))
        return listed == want and fresh and shown

    shown = until(page, f"every replica of {want} listed, the warm ones fresh", filled)
    for pool in warm:
        for r in shown[pool]:
            assert r["badge"] == "fresh"
            assert "trouble" not in r["classes"]
            assert r["score"][:4].replace(".", "").isdigit(), r  # e.g. "0.93"
    assert stat(page, "llama-8b", 0)[0].replace("\n", " ").startswith("4 / 4")
    assert console_errors(page) == [], "the page ran into errors (a CSP violation shows here too)"


def test_the_decision_feed_shows_requests_sent_while_open(own_gateway, page):
    # The page has asked for the feed (its hint comes from that answer), so
    # the gateway records from now on.
    until(page, "the feed asked for", lambda: page.find_element(By.ID, "feed-hint").text.startswith("Sampled"))
    run = uuid.uuid4().hex[:8]
    sent = {f"ui-{run}-llama-{i}": LLAMA for i in range(6)}
    sent.update({f"ui-{run}-qwen-{i}": QWEN for i in range(3)})
    with ThreadPoolExecutor(max_workers=9) as pool:
        statuses = list(pool.map(lambda kv: chat(own_gateway, kv[0], kv[1], stream=kv[0].endswith("1")), sent.items()))
    assert statuses == [200] * len(sent)

    def listed():
        rows = {r["id"]: r for r in feed_rows(page)}
        return rows if all(i in rows for i in sent) else None

    rows = until(page, f"the feed listing {sorted(sent)}", listed)
    llama = own_gateway.pools["llama-8b"]
    for request_id, model in sent.items():
        row = rows[request_id]
        time_, shown_id, shown_model, _tenant, band, chosen, runner_up, gap, _queue, ttft, status = row["cells"]
        assert shown_model == model
        assert band == "standard"
        assert status == "200"
        assert ttft.endswith("ms") or ttft.endswith(" s"), row
        if model == LLAMA:
            assert row["pool"] == "llama-8b"
            assert chosen in llama and runner_up in llama and chosen != runner_up, row
            assert gap.startswith("+"), row
        else:
            assert chosen in own_gateway.pools["qwen-32b"], row

    # The pool's figures count them.
    def counted():
        requests, ttft = stat(page, "llama-8b", 2), stat(page, "llama-8b", 3)
        n = int(requests[1].split(" ")[0].replace(",", ""))
        return n >= 6 and not ttft[0].startswith("—") and (requests, ttft)

    until(page, "the llama pool counting the requests and their TTFT", counted)

    # Filter by pool: only qwen's lines stay.
    Select(page.find_element(By.ID, "filter-pool")).select_by_value("qwen-32b")
    shown = {r["id"] for r in feed_rows(page) if r["shown"]}
    assert shown and all(i in shown for i in sent if "qwen" in i)
    assert not any(i in shown for i in sent if "llama" in i)
    assert all(r["pool"] == "qwen-32b" for r in feed_rows(page) if r["shown"])
    Select(page.find_element(By.ID, "filter-pool")).select_by_value("")
    Select(page.find_element(By.ID, "filter-model")).select_by_value(LLAMA)
    shown = {r["id"] for r in feed_rows(page) if r["shown"]}
    assert {i for i in sent if "llama" in i} <= shown and not any("qwen" in i for i in shown)
    Select(page.find_element(By.ID, "filter-model")).select_by_value("")

    # A click on a request id shows its whole record.
    target = f"ui-{run}-llama-0"
    page.find_element(By.CSS_SELECTOR, f'#feed tr[data-request-id="{target}"] button.id').click()

    def record():
        dialog = page.find_element(By.ID, "record")
        if not dialog.get_attribute("open"):
            return None
        body = dialog.find_element(By.ID, "record-body")
        candidates = body.find_elements(By.CSS_SELECTOR, "table tbody tr")
        return len(candidates) == len(llama) and (dialog.text, candidates)

    text, candidates = until(page, f"the record of {target}", record)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(SHOTS / "fleet-record-light.png"))
    assert target in text
    assert "Candidates, best first (4 scored)" in text
    assert "chosen" in candidates[0].text, "the chosen replica heads the candidates"
    assert rows[target]["cells"][5] in candidates[0].text
    page.find_element(By.ID, "record-close").click()
    until(page, "the record closed", lambda: not page.find_element(By.ID, "record").get_attribute("open"))
    assert console_errors(page) == []


def test_a_stopped_replica_turns_stale_on_the_page(own_gateway, page):
    victim = own_gateway.pools["llama-8b"][0]
    until(page, f"{victim} fresh", lambda: (row_of(page, "llama-8b", victim) or {}).get("health") == "fresh")
    # The simulator's fault API: the replica stops listening at once.
    assert httpx.post(f"http://{victim}/admin/crash", timeout=10).status_code == 200

    def in_trouble():
        row = row_of(page, "llama-8b", victim)
        return row and row["health"] in ("stale", "unhealthy", "unreachable") and row

    row = until(page, f"{victim} marked stale or unreachable", in_trouble, timeout=10)
    assert "trouble" in row["classes"] or "warn" in row["classes"], row
    assert row["badge"] == row["health"]
    until(page, "the pool counting 3 of 4 replicas ready", lambda: stat(page, "llama-8b", 0)[0].replace("\n", " ").startswith("3 / 4"))
    others = [r for r in replicas(page)["llama-8b"] if r["address"] != victim]
    assert all(r["health"] == "fresh" for r in others), others


def test_screenshots_light_and_dark(own_gateway, page):
    """Screenshots at both sizes in both themes, taken with requests in
    flight so the sparklines and the feed have something to show."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Long prompts fill the smaller replicas' KV cache, and an adapter
    # becomes resident: something to see.
    models = [QWEN, LLAMA, "sql-lora"]
    jobs = [(f"shot-{i}", models[i % 3], i % 2 == 0) for i in range(96)]
    with httpx.Client(limits=httpx.Limits(max_connections=32)) as client, ThreadPoolExecutor(max_workers=32) as pool:
        futures = [pool.submit(chat, own_gateway, rid, model, stream, 300, client, 2500) for rid, model, stream in jobs]

        def loaded():
            done = sum(1 for r in feed_rows(page) if r["id"].startswith("shot-"))
            busy = page.execute_script(
                "return [...document.querySelectorAll('[data-col=\"inflight\"]')].some((c) => Number(c.innerText) > 0)")
            return done >= 32 and busy

        until(page, "a first wave of requests answered, more in flight", loaded, timeout=60)
        # The whole page (the feed scrolls within its card), light, at
        # laptop width: the picture in the docs.
        color_scheme(page, "light")
        viewport(page, 1366, 768)
        page.execute_script("window.scrollTo(0, 0)")
        redrawn(page)
        height = page.execute_script("return document.documentElement.scrollHeight")
        viewport(page, 1366, height)
        redrawn(page)
        full = SHOTS / "fleet-full-light.png"
        assert page.save_screenshot(str(full))
        if os.environ.get("INFERGATE_DOC_SCREENSHOT") == "1":
            DOC_IMAGE.parent.mkdir(exist_ok=True)
            shutil.copyfile(full, DOC_IMAGE)
        backgrounds = {}
        for scheme in ("light", "dark"):
            color_scheme(page, scheme)
            backgrounds[scheme] = page.execute_script("return getComputedStyle(document.body).backgroundColor")
            for name, (width, height) in {"laptop": (1366, 768), "wide": (2560, 1440)}.items():
                viewport(page, width, height)
                page.execute_script("window.scrollTo(0, 0)")
                redrawn(page)
                path = SHOTS / f"fleet-{name}-{scheme}.png"
                assert page.save_screenshot(str(path)), path
                assert png_size(path) == (width, height)
        assert backgrounds["light"] != backgrounds["dark"], backgrounds
        statuses = [f.result() for f in futures]
    # The stopped replica is no longer picked: every request was served.
    assert statuses == [200] * len(jobs), statuses
    viewport(page, 1366, 768)
    assert console_errors(page) == []


def redrawn(driver):
    """Wait for the page's next poll, which redraws with the current theme
    and size."""
    before = driver.find_element(By.ID, "connection-text").text
    until(driver, "the page redrawn", lambda: driver.find_element(By.ID, "connection-text").text != before)
