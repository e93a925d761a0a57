"""Headless Chromium (Debian's `chromium`) for the status-page tests: DOM dumps and
screenshots, each run in a fresh empty profile, with everything that would reach the network
on its own switched off."""

from __future__ import annotations

import html.parser
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.deploy.helpers import REPO, ensure_tool

OUT = REPO / "out"  # gitignored: test artefacts (screenshots)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--disable-default-apps", "--disable-extensions", "--no-default-browser-check"]


def chromium() -> str | None:
    """The chromium binary, installed with apt-get on first use when possible."""
    return (shutil.which("chromium") or shutil.which("chromium-browser")
            or ensure_tool("chromium", "chromium"))


def _run(binary: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="bubblespec-chromium-") as profile:
        return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout_s, check=False)


def capture(binary: str, url: str, png: Path | None = None, size: str = "1280,900",
            budget_ms: int = 4000, timeout_s: float = 90) -> str:
    """Load `url`, let its scripts run for `budget_ms` of virtual time (fetches complete
    within it), and return the DOM; with `png`, a screenshot of that same moment too."""
    args = [f"--virtual-time-budget={budget_ms}", f"--window-size={size}"]
    if png is not None:
        png.parent.mkdir(parents=True, exist_ok=True)
        args.append(f"--screenshot={png}")
    r = _run(binary, [*args, "--dump-dom", url], timeout_s)
    if r.returncode != 0 or "<html" not in r.stdout:
        raise AssertionError(f"chromium --dump-dom failed ({r.returncode}): {r.stderr[-2000:]}")
    if png is not None and (not png.is_file() or png.stat().st_size < 1000):
        raise AssertionError(f"no screenshot at {png}: {r.stderr[-2000:]}")
    return r.stdout


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
