"""Departures from pre-generated drafts beside suffix decoding on the same responses
(`bench/departures.py`): tail forwards, the three kinds, and which modes are compared."""

from __future__ import annotations

import copy

import pytest

from bubblespec.bench.departures import departure_lines, departure_rows, departures


def _step(lengths, steps, pregen=None, div=None, ended=None):
    s = {"output_lengths": [lengths], "request_decode_steps": [steps]}
    if pregen is not None:
        s.update(request_accepted_pregen=[pregen], request_first_divergence=[div],
                 request_draft_ran_out=[ended])
    return s


L = [20, 20, 20, 20]
SUFFIX = {"steps": [_step(L, [20] * 4), _step(L, [10, 10, 10, 20])]}
KEYED = {"steps": [_step(L, [20] * 4, [0] * 4, [None] * 4, [None] * 4),
                   # never left; draft ended at 4; a flip at 4 nothing caught; a flip at 4
                   # after which 12 more pre-generated tokens were accepted (caught)
                   _step(L, [3, 12, 5, 2], [18, 4, 2, 16], [None, 4, 4, 4],
                         [None, True, False, False])]}


def test_kinds_and_tail_forwards():
    d = departures(KEYED["steps"])
    assert d["index"].tolist() == [1, 2, 3]
    assert d["tail"].tolist() == [16, 16, 16]
    # forwards before the divergence: 4 less the pre-generated tokens accepted there
    assert d["forwards"].tolist() == [12, 3, 2]
    assert d["kind"].tolist() == [0, 1, 2]  # ended, flip, caught
    assert departures(SUFFIX["steps"]) is None  # no divergence records


def test_rows_set_each_tail_beside_suffix_on_the_same_response():
    rows = {r["kind"]: r for r in departure_rows({"suffix-keyed": SUFFIX,
                                                  "bubblespec-keyed": KEYED})["bubblespec-keyed"]}
    assert rows["all"]["responses"] == 3
    assert rows["all"]["tail_tokens_per_forward"] == pytest.approx(48 / 17)
    assert rows["all"]["suffix_tokens_per_forward"] == pytest.approx(60 / 40)
    assert rows["all"]["at_or_above_suffix"] == pytest.approx(2 / 3)
    assert rows["ended"]["tail_tokens_per_forward"] == pytest.approx(16 / 12)
    assert rows["ended"]["at_or_above_suffix"] == 0.0  # 1.33 against suffix's 2
    assert rows["flip"]["tail_tokens_per_forward"] == pytest.approx(16 / 3)
    assert rows["caught"]["suffix_tokens_per_forward"] == 1.0
    line = departure_lines({"suffix-keyed": SUFFIX, "bubblespec-keyed": KEYED})[0]
    assert line.startswith("bubblespec-keyed: all 3: 2.82 vs 1.50 (67% at or above)")


def test_only_keyed_pregenerating_modes_on_the_same_tokens():
    other = copy.deepcopy(KEYED)
    other["steps"][1]["output_lengths"] = [[20, 20, 20, 21]]  # not the same tokens
    first = {"suffix-keyed": SUFFIX, "bubblespec": KEYED, "bubblespec-keyed-window": other,
             "nospec-keyed": SUFFIX}
    assert departure_rows(first) == {}
    assert departure_lines({"bubblespec-keyed": KEYED}) == []  # no suffix-keyed beside it
