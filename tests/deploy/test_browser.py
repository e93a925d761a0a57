"""The browser capture of the status-page tests (tests/deploy/browser.py) keeps its hard
deadline, in real headless Chromium, against pages that never settle: one polls its server
every 50 ms and keeps a fetch open that is never answered (the status page of a busy cluster,
on which `--dump-dom --virtual-time-budget` never returned), one spins its renderer's main
thread forever (no DevTools call into the page can be answered). The capture takes the DOM of
the first once the condition holds, and on both raises CaptureTimeout within its deadline plus
the clean-up; after every capture no process of the browser is alive (its process group, and
the strays that name its temporary directory) and that directory is gone."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.browser import CaptureTimeout, Dom, capture, chromium

psutil = pytest.importorskip("psutil")

DEADLINE_S = 12.0  # short, but past chromium's start on a loaded machine
SLACK_S = 10.0  # what the clean-up may add to a deadline

POLLING = """<!doctype html><html><head><title>polls forever</title></head>
<body data-state="polling" data-polls="0"><p id="polls">0</p><script>
let polls = 0;
fetch("hang", {cache: "no-store"}).catch(() => {});  // never answered
setInterval(() => {
  fetch("poll", {cache: "no-store"}).then((r) => r.json()).then(() => {
    polls += 1;
    document.body.dataset.polls = String(polls);
    document.getElementById("polls").textContent = String(polls);
  }).catch(() => {});
}, 50);
</script></body></html>"""

SPINNING = """<!doctype html><html><head><title>spins forever</title></head>
<body data-state="spinning"><script>setTimeout(() => { for (;;) {} }, 100);</script>
</body></html>"""


class PageServer(http.server.ThreadingHTTPServer):
    """The two pages, `poll` (counted) and `hang` (answered only when the server stops)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.polls = 0
        self.hanging = 0
        self.stop = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    server: PageServer

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/hang":
            self.server.hanging += 1
            self.server.stop.wait(120)
            return  # closed unanswered
        if path == "/poll":
            self.server.polls += 1
            body, kind = json.dumps({"n": self.server.polls}).encode(), "application/json"
        elif path in ("/polling", "/spinning"):
            body, kind = (POLLING if path == "/polling" else SPINNING).encode(), "text/html"
        else:
            self.send_error(404)
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError:
            pass  # the browser was killed meanwhile

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def page_server() -> Iterator[PageServer]:
    server = PageServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def browser() -> str:
    binary = chromium()
    if binary is None:
        pytest.skip("chromium not installed and apt-get not usable (or no `websockets`, its "
                    "DevTools client): browser test not run")
    return binary


class Launches:
    """What capture's on_launch reports: the browser's process group and directory."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, Path]] = []

    def __call__(self, pgid: int, root: Path) -> None:
        self.seen.append((pgid, root))

    def assert_cleaned_up(self) -> None:
        assert len(self.seen) == 1, self.seen
        pgid, root = self.seen[0]
        alive = []
        for p in psutil.process_iter(["pid", "status", "cmdline", "name"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                    continue  # dead, only not reaped by its (new) parent
                if os.getpgid(p.pid) == pgid or str(root) in " ".join(p.info["cmdline"] or []):
                    alive.append((p.pid, p.info["name"]))
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        assert not alive, f"left running after the capture: {alive}"
        assert not root.exists(), f"{root} left behind"


def test_capture_returns_while_the_page_polls_forever(browser: str, tmp_path: Path) -> None:
    launches = Launches()
    shot = tmp_path / "polling.png"
    with page_server() as server:
        url = f"http://127.0.0.1:{server.server_port}/polling"
        t0 = time.monotonic()
        dom = Dom(capture(browser, url, shot, until="+document.body.dataset.polls >= 20",
                          deadline_s=60, on_launch=launches))
        elapsed = time.monotonic() - t0
        assert server.hanging >= 1 and not server.stop.is_set(), "the never-answered fetch"
    assert int(dom.body()["data-polls"]) >= 20, dom.body()
    assert elapsed < 60 + SLACK_S
    assert shot.stat().st_size > 1000
    launches.assert_cleaned_up()


@pytest.mark.parametrize("page", ["polling", "spinning"])
def test_deadline_holds_on_a_page_that_never_settles(browser: str, page: str) -> None:
    launches = Launches()
    with page_server() as server:
        url = f"http://127.0.0.1:{server.server_port}/{page}"
        t0 = time.monotonic()
        with pytest.raises(CaptureTimeout, match="deadline passed") as failed:
            capture(browser, url, until='document.body.dataset.state === "settled"',
                    deadline_s=DEADLINE_S, on_launch=launches)
        elapsed = time.monotonic() - t0
        polls = server.polls
    assert elapsed < DEADLINE_S + SLACK_S, elapsed
    if page == "polling":  # it ran out while the page polled, not while chromium started
        assert polls > 0 and 'data-state="polling"' in str(failed.value), str(failed.value)
    launches.assert_cleaned_up()
