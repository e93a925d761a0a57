"""The layout table of docs/layout.md matches the tree, in both directions.

Every package directory under `bubblespec/` (a directory with an `__init__.py`) and every
top-level module of `bubblespec/` is named in the table's path column, and every path the
table names exists. The negative controls run the same checks on a fabricated tree.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYOUT = REPO / "docs" / "layout.md"
HEADER = "| path | role |"


def table_paths(markdown: str) -> list[str]:
    """The paths named (in backticks) in the first column of the `| path | role |` table."""
    lines = markdown.splitlines()
    start = lines.index(HEADER)
    paths: list[str] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first = re.split(r"(?<!\\)\|", line)[1]
        paths += re.findall(r"`([^`]+)`", first)
    return paths


def packages(root: Path) -> set[str]:
    """`bubblespec/...` package directories (with `__init__.py`) and top-level modules."""
    pkg = root / "bubblespec"
    dirs = {f"{p.parent.relative_to(root).as_posix()}/" for p in pkg.rglob("__init__.py")
            if "__pycache__" not in p.parts and p.parent != pkg}
    modules = {p.relative_to(root).as_posix() for p in pkg.glob("*.py") if p.name != "__init__.py"}
    return dirs | modules


def check(root: Path, named: list[str]) -> tuple[set[str], set[str]]:
    """(in the tree but not in the table, in the table but not in the tree)."""
    missing_rows = packages(root) - set(named)
    missing_paths = {p for p in named if not (root / p.rstrip("/")).exists()}
    return missing_rows, missing_paths


def test_every_package_has_a_row() -> None:
    missing_rows, _ = check(REPO, table_paths(LAYOUT.read_text()))
    assert not missing_rows, f"packages/modules without a row in docs/layout.md: {sorted(missing_rows)}"


def test_every_named_path_exists() -> None:
    _, missing_paths = check(REPO, table_paths(LAYOUT.read_text()))
    assert not missing_paths, f"docs/layout.md names paths that do not exist: {sorted(missing_paths)}"


def test_the_table_is_read() -> None:
    named = table_paths(LAYOUT.read_text())
    assert "bubblespec/core/" in named and "bubblespec/rpc/v1/" in named and "tests/" in named
    assert all(not p.startswith("|") for p in named)


def _tree(root: Path) -> None:
    for d in ("bubblespec/a", "bubblespec/a/sub", "bubblespec/b/__pycache__"):
        (root / d).mkdir(parents=True)
    for f in ("bubblespec/__init__.py", "bubblespec/a/__init__.py", "bubblespec/a/sub/__init__.py",
              "bubblespec/b/__pycache__/__init__.py", "bubblespec/top.py"):
        (root / f).write_text("")


def test_negative_control_a_package_without_a_row(tmp_path: Path) -> None:
    _tree(tmp_path)
    table = f"{HEADER}\n|---|---|\n| `bubblespec/a/` | a |\n| `bubblespec/top.py` | t |\n"
    missing_rows, missing_paths = check(tmp_path, table_paths(table))
    assert missing_rows == {"bubblespec/a/sub/"}  # __pycache__ is no package
    assert not missing_paths


def test_negative_control_a_row_without_a_directory(tmp_path: Path) -> None:
    _tree(tmp_path)
    table = (f"{HEADER}\n|---|---|\n| `bubblespec/a/`, `bubblespec/a/sub/` | a \\| b |\n"
             "| `bubblespec/top.py` | t |\n| `bubblespec/gone/` | fabricated |\n\nafter the table\n"
             "| `bubblespec/not-a-row/` | x |\n")
    missing_rows, missing_paths = check(tmp_path, table_paths(table))
    assert not missing_rows
    assert missing_paths == {"bubblespec/gone/"}
