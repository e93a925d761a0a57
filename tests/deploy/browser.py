"""Headless Chromium (Debian's `chromium`) for the status-page tests: DOM snapshots and
screenshots, each in a fresh empty profile, with everything that would reach the network on
its own switched off.

The browser is driven over its DevTools protocol, in real time, with one hard wall-clock
deadline for the whole capture. `--dump-dom --virtual-time-budget` is not used: virtual time
only advances while no fetch is pending, so a page that polls a busy server (the status page
while a rollout step runs) can keep it from ever reaching the budget, and the browser never
exits. Here the caller says what it waits for (a JavaScript condition, e.g. "the rank table has
every rank"), and the capture takes the DOM as soon as that holds.

Chromium runs in its own session (process group), with a temporary directory as its profile
and as its HOME; its output goes to a file, never to a pipe that a helper process could hold
open. Whatever happens (condition met, deadline, browser crash, an exception in the caller's
hook), the whole group is killed with SIGKILL, and so are the crash handlers that Debian's
build starts in sessions of their own (found by that directory on their command line); all of
them are gone before `capture` returns or raises, and the directory is removed. So a capture
returns or raises within its deadline plus a few seconds of clean-up.
"""

from __future__ import annotations

import base64
import html.parser
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from tests.deploy.helpers import REPO, ensure_tool

OUT = REPO / "out"  # gitignored: test artefacts (screenshots)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
         # the pages are on loopback: never through a proxy from the environment
         "--no-proxy-server",
         # a page is polled while nobody looks at it: no timer or renderer throttling
         "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
         "--disable-backgrounding-occluded-windows",
         "--remote-debugging-port=0"]  # the port chosen is in <profile>/DevToolsActivePort

LOADED = "document.readyState === 'complete'"
CLEANUP_S = 5.0  # after a kill: how long the group's processes may take to be gone


class CaptureError(AssertionError):
    """The browser failed (did not start, crashed, a DevTools call failed)."""


class CaptureTimeout(CaptureError):
    """The capture's deadline passed (the browser was killed)."""


def chromium() -> str | None:
    """The chromium binary, installed with apt-get on first use when possible; None also when
    `websockets` (the DevTools client, in the venv through uvicorn[standard]) is missing."""
    try:
        import websockets.sync.client  # noqa: F401
    except ImportError:
        return None
    return (shutil.which("chromium") or shutil.which("chromium-browser")
            or ensure_tool("chromium", "chromium"))


def group_alive(pgid: int, marker: str | None = None) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, plus any whose command line
    contains `marker` (the browser's temporary directory: a helper that left the group)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp ... (comm may hold ")")
            cmdline = (Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
                       if marker else "")
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] in ("Z", "X"):
            continue  # dead; reaped by whoever is its parent now
        if int(fields[2]) == pgid or (marker is not None and marker in cmdline):
            found.append(int(entry))
    return found


def _kill_group(proc: subprocess.Popen, marker: str) -> None:
    """SIGKILL the browser's whole process group and the processes that name `marker` on
    their command line, reap the browser, and wait until none of them is alive."""
    pgid = proc.pid  # its own session: the group id is its pid; kept while it is unreaped
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=CLEANUP_S)
    except subprocess.TimeoutExpired:
        pass  # SIGKILLed: only a process stuck in the kernel gets here
    end = time.monotonic() + CLEANUP_S
    while left := group_alive(pgid, marker):
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > end:
            raise CaptureError(f"chromium processes survived SIGKILL: {left}")
        time.sleep(0.05)


@contextmanager
def _browser(binary: str, root: Path, size: str) -> Iterator[subprocess.Popen]:
    """Chromium in its own session with everything it writes under `root` (profile, HOME,
    XDG dirs, its output in chromium.log); killed, the whole group and every process naming
    `root`, when the block ends, however it ends."""
    env = {**os.environ, "HOME": str(root), "XDG_CONFIG_HOME": str(root / "config"),
           "XDG_CACHE_HOME": str(root / "cache")}
    with open(root / "chromium.log", "wb") as out:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={root / 'profile'}", f"--window-size={size}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, close_fds=True)
    try:
        yield proc
    finally:
        _kill_group(proc, str(root))


class _DevTools:
    """A DevTools connection to the browser (flat sessions) whose every wait ends at
    `deadline` (time.monotonic()); `fail(message, kind)` raises."""

    def __init__(self, ws: Any, deadline: float, fail: Callable[..., NoReturn]) -> None:
        self.ws, self.deadline, self.fail, self.last_id = ws, deadline, fail, 0

    def left(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.fail(f"deadline passed waiting for {what}", CaptureTimeout)
        return left

    def call(self, method: str, session: str | None = None, check: bool = True,
             waiting_for: str | None = None, **params: Any) -> dict[str, Any]:
        """The result of `method`; its error fails the capture, or with check=False is
        returned as {"error": ...}. A deadline is reported as waiting for `waiting_for`
        (default: the method)."""
        from websockets.exceptions import ConnectionClosed

        self.last_id += 1
        message: dict[str, Any] = {"id": self.last_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        try:
            self.ws.send(json.dumps(message))
            while True:
                try:
                    reply = json.loads(self.ws.recv(timeout=self.left(waiting_for or method)))
                except TimeoutError:
                    self.fail(f"deadline passed waiting for {waiting_for or method}",
                              CaptureTimeout)
                if reply.get("id") == self.last_id:  # anything else is an event
                    break
        except ConnectionClosed as e:
            self.fail(f"DevTools connection lost during {method} (browser died?): {e}")
        if "error" in reply:
            if check:
                self.fail(f"{method} failed: {reply['error']}")
            return {"error": reply["error"]}
        return reply.get("result", {})


@contextmanager
def _devtools(port: int, path: str, deadline: float,
              fail: Callable[..., NoReturn]) -> Iterator[_DevTools]:
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect

    left = deadline - time.monotonic()
    if left <= 0:
        fail("deadline passed waiting for chromium to start", CaptureTimeout)
    # a socket of our own: never through a proxy from the environment, its connect bounded
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=left)
    except OSError as e:
        fail(f"no DevTools on port {port}: {e}")
    try:
        ws = connect(f"ws://127.0.0.1:{port}{path}", sock=sock, compression=None,
                     max_size=None, ping_interval=None, close_timeout=1,
                     open_timeout=max(0.1, deadline - time.monotonic()))
    except TimeoutError:
        sock.close()
        fail("deadline passed in the DevTools handshake", CaptureTimeout)
    except (OSError, WebSocketException) as e:  # refused, or the connection lost
        sock.close()
        fail(f"DevTools handshake failed: {e!r}")
    with ws:  # closing waits close_timeout at most
        yield _DevTools(ws, deadline, fail)


def _endpoint(proc: subprocess.Popen, profile: Path, deadline: float,
              fail: Callable[..., NoReturn]) -> tuple[int, str]:
    """The DevTools port and browser path that Chromium writes to DevToolsActivePort."""
    active = profile / "DevToolsActivePort"
    while True:
        try:
            port, path = active.read_text().split()[:2]
            return int(port), path
        except (OSError, ValueError):
            pass  # not there, or not completely written yet
        if proc.poll() is not None:
            fail(f"chromium exited ({proc.returncode}) before it served DevTools")
        if time.monotonic() > deadline:
            fail("deadline passed waiting for chromium to start", CaptureTimeout)
        time.sleep(0.05)


# `until` is wrapped: a runtime error in it (document.body not there yet) counts as "not
# yet", a syntax error fails at once; `probe` describes the page for the error on a deadline
WAIT = """(() => {
  const probe = () => document.URL + " readyState=" + document.readyState + " <body " +
    (document.body ? [...document.body.attributes].map((a) => a.name + '="' + a.value + '"')
                                                  .join(" ") : "(none)") + ">";
  if (document.URL === "about:blank") return [false, probe()];
  try { return [Boolean(__UNTIL__), probe()]; } catch (e) { return [false, probe() + " " + e]; }
})()"""


def capture(binary: str, url: str, png: Path | None = None, size: str = "1280,900",
            until: str = LOADED, deadline_s: float = 60.0, poll_s: float = 0.1,
            on_launch: Callable[[int, Path], None] | None = None) -> str:
    """Load `url` in a fresh headless Chromium, wait (in real time) until the JavaScript
    expression `until` is true, and return the DOM (`document.documentElement.outerHTML`);
    with `png`, a screenshot (the `size` viewport) taken right after it.

    Everything, browser start included, happens within `deadline_s` of wall-clock time:
    past it, the browser is killed and CaptureTimeout raised, with the page's last state.
    `on_launch(pgid, root)` is called once the browser runs, with its process group and its
    temporary directory (for tests of the clean-up: afterwards no process of that group or
    naming that directory is alive, and the directory is gone)."""
    deadline = time.monotonic() + deadline_s
    width, height = (int(v) for v in size.split(","))
    with tempfile.TemporaryDirectory(prefix="bubblespec-chromium-",
                                     ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        profile, log = root / "profile", root / "chromium.log"

        def fail(message: str, kind: type[CaptureError] = CaptureError) -> NoReturn:
            try:
                tail = log.read_text(errors="replace")[-2000:]
            except OSError:
                tail = ""
            raise kind(f"capture of {url} ({deadline_s:g} s deadline): {message}\n"
                       f"chromium output:\n{tail}")

        with _browser(binary, root, size) as proc:
            if on_launch is not None:
                on_launch(proc.pid, root)
            port, path = _endpoint(proc, profile, deadline, fail)
            with _devtools(port, path, deadline, fail) as devtools:
                target = devtools.call("Target.createTarget", url="about:blank")["targetId"]
                session = devtools.call("Target.attachToTarget", targetId=target,
                                        flatten=True)["sessionId"]
                devtools.call("Emulation.setDeviceMetricsOverride", session, width=width,
                              height=height, deviceScaleFactor=1, mobile=False)
                devtools.call("Page.bringToFront", session)
                nav = devtools.call("Page.navigate", session, url=url)
                if nav.get("errorText"):
                    fail(f"navigation failed: {nav['errorText']}")
                wait = WAIT.replace("__UNTIL__", until)
                state = "(not evaluated yet)"
                while True:
                    # an error reply: the document changed under the call (navigation)
                    result = devtools.call(
                        "Runtime.evaluate", session, check=False, expression=wait,
                        returnByValue=True, waiting_for=f"`{until}`; the page was: {state}")
                    if "exceptionDetails" in result:  # the expression does not compile
                        fail(f"`until` failed: {result['exceptionDetails']}")
                    if "error" not in result:
                        done, state = result["result"]["value"]
                        if done:
                            break
                    if time.monotonic() + poll_s > deadline:
                        fail(f"deadline passed waiting for `{until}`; the page was: {state}",
                             CaptureTimeout)
                    time.sleep(poll_s)
                dom = devtools.call("Runtime.evaluate", session,
                                    expression="document.documentElement.outerHTML",
                                    returnByValue=True)["result"]["value"]
                if png is not None:
                    shot = devtools.call("Page.captureScreenshot", session, format="png")
                    png.parent.mkdir(parents=True, exist_ok=True)
                    png.write_bytes(base64.b64decode(shot["data"]))
    if "<html" not in dom:
        raise CaptureError(f"capture of {url}: no <html> in the DOM: {dom[:500]!r}")
    if png is not None and (not png.is_file() or png.stat().st_size < 1000):
        raise CaptureError(f"capture of {url}: no screenshot at {png}")
    return dom


class Dom(html.parser.HTMLParser):
    """Elements of a dumped DOM: (tag, attributes) in document order, plus the text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag
                and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]

    def with_class(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and cls in a.get("class", "").split()]

    def body(self) -> dict[str, str]:
        return self.find("body")[0]
