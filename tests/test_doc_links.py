"""Relative links in the README and docs/ resolve: the file exists and the anchor is a heading.

Anchors follow GitHub's rule: the heading in lower case, punctuation other than `-` and `_`
dropped, spaces turned into `-`, and `-1`, `-2`, ... for repeats. The negative control
feeds the check a link to a heading that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "tests" / "README.md", REPO / "deploy" / "README.md",
        *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings (outside code blocks)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6} (.+)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path, text: str) -> list[str]:
    """The relative links of `text` (the content of `doc`) that do not resolve."""
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        missing_anchor = (dest.exists() and bool(anchor) and dest.suffix == ".md"
                          and anchor not in anchors(dest.read_text()))
        if not dest.exists() or missing_anchor:
            bad.append(target)
    return bad


def test_relative_links_resolve() -> None:
    bad = {d.relative_to(REPO).as_posix(): b for d in DOCS if d.exists()
           if (b := broken_links(d, d.read_text()))}
    assert not bad, f"links that do not resolve: {bad}"


def test_github_anchor_rule() -> None:
    text = "# Scale (MODELLED)\n## Soak: 200 steps\n## Paced, 2 ranks\n## Paced, 2 ranks\n"
    assert anchors(text) == {"scale-modelled", "soak-200-steps", "paced-2-ranks", "paced-2-ranks-1"}


def test_negative_control_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Here\n```\n# not a heading\n```\n")
    doc = tmp_path / "a.md"
    text = "[ok](b.md#here) [gone](b.md#not-a-heading) [no file](c.md) [web](https://x.y/#z)"
    assert broken_links(doc, text) == ["b.md#not-a-heading", "c.md"]
