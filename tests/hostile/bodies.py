"""Hostile request bodies, generated from the servers' own OpenAPI schemas and mutated.

A body starts as a normal request of the route and gets one mutation: a field the route's
schema declares (found by walking `/openapi.json`, `$ref`s and `anyOf`s included) is set
to a hostile value (huge or negative integers, NaN and infinities, long or odd strings,
wrong types, deep nesting, empty or long lists), dropped, or joined by an unknown field;
or the whole body is replaced. NaN and infinities go out as the bare `NaN` / `Infinity`
tokens Python's json writes (not JSON: the server must answer 4xx, not choke).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

Path = tuple[str | int, ...]

HUGE_INTS = [-1, -(2**63) - 1, -(10**30), 2**31, 2**31 - 1, 2**53, 2**63 - 1, 2**63, 2**64,
             10**30]
ODD_FLOATS = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, -0.0, 2.5]
ODD_STRINGS = ["", "x" * 5000, "\u0000", "ünï©ødé " * 50, "../../etc/passwd", "1e400", "-1",
               "null", "a" * 257]
SCALARS = [None, True, False, [], {}, [None], {"": 0}]


class Nested:
    """A list nested `depth` deep, written as raw JSON (no recursion when serialising)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def __repr__(self) -> str:
        return f"Nested({self.depth})"


hostile_values = st.one_of(
    st.sampled_from(HUGE_INTS),
    st.sampled_from(ODD_FLOATS),
    st.sampled_from(ODD_STRINGS),
    st.sampled_from(SCALARS),
    st.lists(st.sampled_from(HUGE_INTS + ODD_FLOATS), min_size=1, max_size=4),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.builds(Nested, st.sampled_from([2, 64, 5000, 100_000])),
    st.just([7] * 70_000),
)


def dumps(body: Any) -> bytes:
    """JSON of `body` (NaN/Infinity as Python writes them; `Nested` spliced in raw)."""
    marks: list[Nested] = []

    def mark(v: Any) -> Any:
        if isinstance(v, Nested):
            marks.append(v)
            return f"\x00nested{len(marks) - 1}\x00"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(body))
    for i, n in enumerate(marks):
        text = text.replace(json.dumps(f"\x00nested{i}\x00"), "[" * n.depth + "]" * n.depth)
    return text.encode()


def schema_paths(openapi: dict, schema: dict, prefix: Path = (), depth: int = 0
                 ) -> Iterator[Path]:
    """Every field path a body schema declares (list items as index 0)."""
    if depth > 8:
        return
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        yield from schema_paths(openapi, openapi["components"]["schemas"][name], prefix,
                                depth + 1)
        return
    for branch in schema.get("anyOf", []) + schema.get("allOf", []):
        yield from schema_paths(openapi, branch, prefix, depth + 1)
    for key, sub in schema.get("properties", {}).items():
        yield (*prefix, key)
        yield from schema_paths(openapi, sub, (*prefix, key), depth + 1)
    if "items" in schema and isinstance(schema["items"], dict):
        yield (*prefix, 0)
        yield from schema_paths(openapi, schema["items"], (*prefix, 0), depth + 1)
    for item in schema.get("prefixItems", []):
        yield from schema_paths(openapi, item, (*prefix, 0), depth + 1)


def body_paths(openapi: dict, route: str) -> list[Path]:
    """The field paths of a POST route's JSON body, from the server's OpenAPI document."""
    op = openapi["paths"][route]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    return sorted(set(schema_paths(openapi, schema)), key=lambda p: (len(p), str(p)))


def put(body: Any, path: Path, value: Any) -> Any:
    """`body` with `value` at `path`, creating the objects and lists on the way."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        node = list(body) if isinstance(body, list) and body else [None]
        node[0] = put(node[0], rest, value)
        return node
    node = dict(body) if isinstance(body, dict) else {}
    node[head] = put(node.get(head), rest, value)
    return node


def drop(body: Any, path: Path) -> Any:
    """`body` without the field at `path` (unchanged where the path does not exist)."""
    body = copy.deepcopy(body)
    node = body
    for part in path[:-1]:
        if isinstance(part, int):
            if not (isinstance(node, list) and node):
                return body
            node = node[0]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return body
    last = path[-1]
    if isinstance(last, str) and isinstance(node, dict):
        node.pop(last, None)
    elif isinstance(last, int) and isinstance(node, list) and node:
        node.clear()
    return body


def mutated(base: dict, paths: list[Path]) -> st.SearchStrategy[tuple[str, Any]]:
    """(what was done, the mutated body) for one mutation of `base` along `paths`."""
    some_path = st.sampled_from(paths)
    objects = [p for p in paths if not isinstance(p[-1], int)]
    return st.one_of(
        st.tuples(some_path, hostile_values).map(
            lambda pv: (f"set {pv[0]} = {pv[1]!r:.60}", put(base, pv[0], pv[1]))),
        some_path.map(lambda p: (f"drop {p}", drop(base, p))),
        st.tuples(st.sampled_from([(), *[p[:-1] for p in objects]]),
                  st.sampled_from(["unknown_field", "__proto__", "x" * 300]), hostile_values)
        .map(lambda t: (f"unknown {t[0]}.{t[1]:.20}", put(base, (*t[0], t[1]), t[2]))),
        hostile_values.map(lambda v: (f"whole body = {v!r:.60}", v)),
    )
