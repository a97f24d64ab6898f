"""The dashboard in a real headless Chromium (Debian's chromium and chromium-driver, through selenium),
against a real `e31 node run` process running a real montecarlo sweep.

The browser signs in with the token, watches the sweep's progress move on the page (waits are on the
page's DOM, never on time), downloads a job's stdout (its bytes are checked against the API's and the
receipt's hash), opens a receipt view; a page without the token shows no data; and requests a web page
of another site could make (a foreign Origin, a rebound DNS name: Chromium resolves evil.test to
127.0.0.1 here, as a rebinding attacker's DNS would) are refused by the node.

Without chromium, chromedriver or selenium the module is skipped with the reason (.ci/run installs
them; a failed install leaves this skipped, not CI failed). E31_DASHBOARD_SCREENSHOT=PATH also saves
the screenshot there (docs/dashboard.png was made so).
"""

from __future__ import annotations

import functools
import http.client
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_node import NodeProcess, wait_for
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import verify
from e31.protocol.receipts import UsageReceipt

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )

JOBS = 5
SAMPLES = 150_000_000
"""About 13 Gfuel a job: most of a second to a few seconds each here, so the page sees the sweep move."""
WAIT = 120.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = NodeProcess(tmp_path_factory.mktemp("dash") / "a")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, downloads: Path) -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
        "--window-size=1400,1100",
        # what a DNS rebinding attacker's resolver would answer for its own name
        "--host-resolver-rules=MAP evil.test 127.0.0.1",
    ):
        options.add_argument(flag)
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    except WebDriverException as e:
        pytest.skip(f"chromium did not start under chromedriver: {e.msg}")
    try:
        driver.set_script_timeout(30)
        driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
        )
        yield driver
    finally:
        driver.quit()


def dom(driver: Any, what: str, script: str, *args: Any) -> Any:
    """Wait until `script` (a JS function body returning a value) is truthy in the page; return it."""
    return wait_for(what, lambda: driver.execute_script(script, *args), WAIT)


def raw_get(node: NodeProcess, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_the_page_without_the_token_shows_no_data(node: NodeProcess, browser: Any) -> None:
    browser.get(node.url + "/")
    dom(browser, "the sign-in form", "return !document.getElementById('login').hidden")
    assert browser.find_element(By.ID, "app").get_attribute("hidden") is not None
    assert node.node_id not in browser.page_source
    # The page's own origin may load the shell, but every data request needs the token.
    answer = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "Promise.all(['/v1/status', '/v1/overview', '/metrics', '/v1/jobs'].map("
        "  p => fetch(p).then(r => r.status))).then(done, e => done(String(e)));"
    )
    assert answer == [401, 401, 401, 401]
    wrong = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/v1/status', {headers: {Authorization: 'Bearer nope'}}).then(r => done(r.status));"
    )
    assert wrong == 401


def test_the_link_e31_dashboard_prints_signs_in_drops_the_token_from_the_url_and_sign_out_forgets_it(
    node: NodeProcess, browser: Any
) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "e31.node", "dashboard", "--data-dir", str(node.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == f"{node.url}/#token={node.token}"
    browser.get(printed.stdout.strip())
    dom(
        browser,
        "the node's id on the page",
        "return document.getElementById('node-id').textContent.includes(arguments[0])",
        node.node_id,
    )
    assert node.token not in browser.current_url
    assert browser.execute_script("return history.length") >= 1 and "#" not in browser.current_url
    browser.find_element(By.ID, "sign-out").click()
    dom(browser, "the sign-in form", "return !document.getElementById('login').hidden")
    assert browser.execute_script("return sessionStorage.getItem('e31-token')") is None
    browser.refresh()
    dom(browser, "the sign-in form again", "return !document.getElementById('login').hidden")
    assert browser.find_element(By.ID, "app").get_attribute("hidden") is not None
    # a wrong token is refused and leaves the page signed out, saying why
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "sign-in").click()
    why = dom(browser, "the refusal", "return document.getElementById('login-error').textContent")
    assert "refused" in why and browser.execute_script("return sessionStorage.getItem('e31-token')") is None


def test_sign_in_watch_a_sweep_download_a_result_and_open_its_receipt(
    node: NodeProcess, browser: Any, downloads: Path, tmp_path: Path
) -> None:
    browser.get(node.url + "/")
    dom(browser, "the sign-in form", "return !document.getElementById('login').hidden")
    browser.find_element(By.ID, "token").send_keys(node.token)
    browser.find_element(By.ID, "sign-in").click()
    dom(
        browser,
        "the node's id on the page",
        "return document.getElementById('node-id').textContent.includes(arguments[0])",
        node.node_id,
    )
    assert browser.execute_script("return sessionStorage.getItem('e31-token')") == node.token
    assert browser.execute_script("return document.cookie") == ""  # no ambient credential

    sweep = node.sweep(JOBS, SAMPLES)
    bid, job_ids = sweep["batch_id"], sweep["job_ids"]
    row = f"batch-{bid}"
    seen: list[int] = []

    def ended() -> int | None:
        value = browser.execute_script(
            "const r = document.getElementById(arguments[0]); return r ? Number(r.dataset.ended) : null;", row
        )
        if value is not None and (not seen or seen[-1] != value):
            seen.append(value)
        return value

    wait_for("the batch on the page", lambda: ended() is not None, WAIT)
    if os.environ.get("E31_DASHBOARD_SCREENSHOT"):  # the picture in the docs: a sweep under way
        wait_for("the sweep under way", lambda: (ended() or 0) >= 2, WAIT)
        browser.save_screenshot(os.environ["E31_DASHBOARD_SCREENSHOT"])
    wait_for("the batch to end on the page", lambda: ended() == JOBS, WAIT)
    assert seen[0] < JOBS and seen == sorted(seen), f"the progress did not move: {seen}"
    assert len(seen) >= 2
    text = browser.find_element(By.ID, row).text
    assert f"{JOBS} / {JOBS}" in text and "done" in text
    served = dom(
        browser,
        "the served totals",
        "const r = document.querySelector(`#served tr[data-submitter='${arguments[0]}'] .served-done`);"
        "return r && Number(r.textContent) >= arguments[1] ? r.textContent : null;",
        node.node_id,
        JOBS,
    )
    assert int(served) >= JOBS

    # Download one job's stdout through the page; its bytes are the API's and match the receipt.
    job = job_ids[0]
    dom(
        browser,
        "the job's download button",
        "return document.querySelector(`#jobs tr[data-job='${arguments[0]}'] button.download`)",
        job,
    )
    browser.execute_script(
        "document.querySelector(`#jobs tr[data-job='${arguments[0]}'] button.download`).click()", job
    )
    target = downloads / f"{job[:12]}-stdout"
    wait_for("the download", lambda: target.exists() and target.stat().st_size > 0, WAIT)
    got = target.read_bytes()
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    conn.request("GET", f"/v1/jobs/{job}/files/stdout", headers={"Authorization": f"Bearer {node.token}"})
    api_bytes = conn.getresponse().read()
    conn.request("GET", f"/v1/jobs/{job}/files/receipt", headers={"Authorization": f"Bearer {node.token}"})
    receipt = verify(conn.getresponse().read(), UsageReceipt)
    conn.close()
    assert got == api_bytes and got.startswith(f"samples {SAMPLES}\n".encode()) and b"pi 3.14" in got
    assert receipt.message.stdout == blob_ref(got)

    # The receipt view shows the signed receipt's fields, once the log holds the sweep's receipts.
    dom(
        browser,
        "the receipt log on the page",
        "const d = document.querySelector('#receipt-log dd');"
        "return d && Number(d.textContent.replace(/,/g, '')) >= arguments[0];",
        JOBS,
    )
    browser.execute_script(
        "document.querySelector(`#jobs tr[data-job='${arguments[0]}'] button.show-receipt`).click()", job
    )
    fuel = dom(
        browser,
        "the receipt view",
        "const c = document.querySelector('#receipt-fields tr[data-field=fuel_used] td');"
        "return !document.getElementById('receipt').hidden && c ? c.textContent : null;",
    )
    assert int(fuel) == receipt.message.fuel_used
    summary = browser.find_element(By.ID, "receipt-summary").text
    assert "signature valid" in summary and str(receipt.signer) in summary
    assert "receipt log" in summary
    # ... and downloads the signed receipt itself, byte for byte what the API serves.
    browser.execute_script("document.querySelector('#receipt-downloads button[data-file=receipt]').click()")
    saved = downloads / f"{job[:12]}-receipt"
    wait_for("the receipt download", lambda: saved.exists() and saved.stat().st_size > 0, WAIT)
    assert verify(saved.read_bytes(), UsageReceipt).message_id == receipt.message_id

    shot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_requests_from_other_sites_and_rebound_names_are_refused(node: NodeProcess, browser: Any) -> None:
    auth = {"Authorization": f"Bearer {node.token}"}
    assert raw_get(node, "/v1/status", auth)[0] == 200
    status, body = raw_get(node, "/v1/status", {**auth, "Origin": "http://evil.test"})
    assert status == 403 and b"another origin" in body
    status, body = raw_get(node, "/v1/status", {**auth, "Sec-Fetch-Site": "cross-site"})
    assert status == 403
    status, body = raw_get(node, "/v1/status", {**auth, "Host": f"evil.test:{node.port}"})
    assert status == 400 and b"unexpected Host header" in body
    for bad in ("nan", "soon", "-inf"):  # a bad long-poll wait is a 400, never a 500
        status, body = raw_get(node, f"/v1/overview?after=x&timeout={bad}", auth)
        assert status == (200 if bad == "-inf" else 400), body

    # A rebound name: the browser reaches the node at evil.test; the node refuses even the shell.
    browser.get(f"http://evil.test:{node.port}/")
    assert "unexpected Host header" in browser.find_element(By.TAG_NAME, "body").text
    assert "sign-in" not in browser.page_source

    # Another site's page (served here from another port) asks the node: refused, and unreadable.
    with _site() as port:
        browser.get(f"http://evil.test:{port}/")
        outcome = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "const api = arguments[0];"
            "Promise.all(["
            "  fetch(api + '/v1/status').then(r => 'read ' + r.status, e => 'refused'),"
            "  fetch(api + '/v1/status', {headers: {Authorization: 'Bearer ' + arguments[1]}})"
            "    .then(r => 'read ' + r.status, e => 'refused'),"
            "  fetch(api + '/v1/status', {mode: 'no-cors'}).then(r => r.type, e => 'refused'),"
            "]).then(done);",
            node.url,
            node.token,
        )
    # Even with the token, the browser gets no readable answer: no CORS headers, and the node said 403.
    assert outcome[0] == "refused" and outcome[1] == "refused" and outcome[2] in ("opaque", "refused")
    status, _ = raw_get(node, "/v1/status", {**auth, "Origin": f"http://evil.test:{port}"})
    assert status == 403


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _site:
    """An unrelated web site on 127.0.0.1 (another port): a page the browser visits."""

    def __enter__(self) -> int:
        self.root = tempfile.TemporaryDirectory()
        Path(self.root.name, "index.html").write_text("<!doctype html><title>another site</title>")
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_Quiet, directory=self.root.name)
        )
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return int(self.server.server_address[1])

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
        self.root.cleanup()
