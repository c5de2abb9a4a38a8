"""The site's page for 05 and the deck for 01, seen in a real browser: headless Chromium (Debian's
``chromium``) opens them from a local HTTP server and we check that the maths rendered, every image
loaded, the console shows no error, and nothing was requested from anywhere but that server.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending
in a NUL byte on file descriptors 3 and 4), so the test needs no extra package and opens no debugging port.
Skipped, saying why, where Chromium is missing (``.ci/run`` installs it) or where ``npm ci`` has not installed
reveal.js and MathJax (``make slides`` and ``make site`` do; ``.ci/run`` runs them before the tests)."""

from __future__ import annotations

import fcntl
import functools
import http.server
import json
import os
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from transformer_from_scratch.nbtools import site, slides, web

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = next((path for path in (os.environ.get("CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                                   shutil.which("chromium-browser"), shutil.which("google-chrome"))
                 if path and Path(path).is_file()), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
         "--window-size=1280,800", "--remote-debugging-pipe"]
TIMEOUT = 30  # seconds for any one step; a page here takes about one

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: `apt-get install chromium`; "
                                                         ".ci/run installs it), so no page can be opened in a browser")


def _above_9(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """A headless Chromium and one tab in it, over the DevTools protocol's pipe transport."""

    def __init__(self, profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4; bash puts our pipe ends there. First they
        # move above 9, so that neither is 3 or 4 already (bash, unlike dash, redirects from two-digit fds).
        to_browser_r, from_browser_w = (_above_9(fd) for fd in (to_browser_r, from_browser_w))
        command = ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}', CHROMIUM,
                   *FLAGS, f"--user-data-dir={profile}", "about:blank"]
        self.process = subprocess.Popen(command, pass_fds=(to_browser_r, from_browser_w), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe (did it crash?)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                self.events.append(reply)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("document.readyState === 'complete'", f"{url} to load")

    def errors(self) -> list[str]:
        """What the console would show in red: exceptions, console.error, failed loads."""
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text"))
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(" ".join(str(arg.get("value", arg.get("description"))) for arg in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"{params['entry']['text']} {params['entry'].get('url', '')}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"failed to load: {params.get('errorText')} ({params.get('type')})")
        return found

    def requested(self) -> list[str]:
        return [event["params"]["request"]["url"] for event in self.events
                if event["method"] == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder served over HTTP on 127.0.0.1 (a thread of this process), and its base URL."""
    root = tmp_path_factory.mktemp("served")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield chromium
    chromium.close()


# The checks, in the page: MathJax finished, produced its output, and left no TeX behind in the text.
MATHS_RENDERED = "document.documentElement.getAttribute('data-mathjax') === 'done'"
MATHJAX_OUTPUTS = "document.querySelectorAll('mjx-container svg').length"
MATHJAX_ERRORS = "document.querySelectorAll('mjx-merror, [data-mjx-error]').length"
RAW_TEX = r"""(() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {acceptNode: (node) =>
    node.parentElement.closest('pre, code, script, style, textarea') ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  const left = [];
  while (walker.nextNode()) {
    const text = walker.currentNode.nodeValue;
    if (/\$[^$\s][^$]*\$|\\\(|\\\[|\\frac|\\sum|\\mathbb/.test(text)) left.push(text.trim().slice(0, 80));
  }
  return left;
})()"""
IMAGES = """Array.from(document.images).map(img => ({src: img.getAttribute('src').slice(0, 60),
                                                   ok: img.complete && img.naturalWidth > 0}))"""


def _check_page(browser: Chromium, url: str, origin: str) -> None:
    browser.open(url)
    browser.wait_for(MATHS_RENDERED, "MathJax to finish typesetting")
    assert browser.evaluate(MATHJAX_OUTPUTS) > 0, "MathJax produced no output: is there maths on this page?"
    assert browser.evaluate(MATHJAX_ERRORS) == 0, "MathJax could not typeset some of the maths"
    assert browser.evaluate(RAW_TEX) == [], "TeX left unrendered in the text"
    images = browser.evaluate(IMAGES)
    assert images, "no image on the page"
    assert [img["src"] for img in images if not img["ok"]] == [], "images that did not load"
    assert browser.errors() == [], "the console shows errors"
    foreign = [u for u in browser.requested() if not u.startswith((origin + "/", "data:", "blob:", "about:"))]
    assert foreign == [], "requests that leave the local server: the page must work offline"


def _need_npm_assets() -> None:
    try:
        web.mathjax_source()
        web.reveal_source()
    except SystemExit as missing:
        pytest.skip(str(missing))


def test_site_page_for_05_renders(browser, served):
    _need_npm_assets()
    root, origin = served
    notebook = REPO / "notebooks" / "05_attention.ipynb"
    site.build(root / "site", notebooks=[notebook], landing=False)
    _check_page(browser, f"{origin}/site/{notebook.stem}.html", origin)
    links = browser.evaluate("Array.from(document.querySelectorAll('nav a')).map(a => a.getAttribute('href'))")
    assert "index.html" in links and f"student/{notebook.name}" in links


def test_deck_for_01_renders(browser, served):
    _need_npm_assets()
    root, origin = served
    notebook = REPO / "notebooks" / "01_linear.ipynb"
    slides.build([notebook], root / "slides")
    _check_page(browser, f"{origin}/slides/{notebook.stem}.slides.html", origin)
    assert browser.evaluate("Reveal.isReady() && Reveal.getTotalSlides()") > 10
    # Walk the deck to its end: every step (slides and fragments) works, and the maths is re-rendered as it shows.
    steps = browser.evaluate("""(async () => {
      let n = 0;
      while (!Reveal.isLastSlide() || Reveal.availableFragments().next) {
        Reveal.next(); n++;
        if (n > 500) break;
      }
      return n;
    })()""")
    assert 10 < steps < 500
    assert browser.evaluate(MATHJAX_ERRORS) == 0
    assert browser.errors() == [], "the console shows errors while stepping through the deck"
