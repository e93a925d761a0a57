"""`bench.coupling`: a drafter following the response's own keyed draft, re-aligned by
position (position keys) or by (context, occurrence) (context keys), on hand-made
responses whose every token is distinct unless the test repeats one on purpose."""

from __future__ import annotations

from bubblespec.bench.coupling import context_slots, coupling_figures, follow

PROMPT = [900, 901, 902, 903]
DRAFT = list(range(100, 120))


def test_an_equal_response_is_predicted_whole() -> None:
    for by_context in (False, True):
        f = follow(DRAFT, DRAFT, by_context, PROMPT)
        assert f == {"predicted": 20, "tail_predicted": 0, "tail": 0, "recouplings": 0}


def test_a_substitution_recouples_both_kinds_at_the_same_positions() -> None:
    new = DRAFT[:5] + [7] + DRAFT[6:]
    pos = follow(DRAFT, new, False, PROMPT)
    # positions 6-9 rebuild the 4-token tail, the draft predicts again from 10 on
    assert pos == {"predicted": 5 + 10, "tail_predicted": 10, "tail": 14, "recouplings": 1}
    ctx = follow(DRAFT, new, True, PROMPT)
    # the context (6, 7, 8, 9) has occurred once in both: the same slot, the same position
    assert ctx == pos


def test_an_insertion_recouples_context_keys_only() -> None:
    new = DRAFT[:5] + [7] + DRAFT[5:]  # one token inserted: every later position shifted
    pos = follow(DRAFT, new, False, PROMPT)
    assert pos["predicted"] == 5 and pos["tail_predicted"] == 0 and pos["recouplings"] == 0
    ctx = follow(DRAFT, new, True, PROMPT)
    # new[6:10] == DRAFT[5:9]: from output position 10 on the draft's slots again
    assert ctx == {"predicted": 5 + 11, "tail_predicted": 11, "tail": 15, "recouplings": 1}
    dele = DRAFT[:5] + DRAFT[6:]  # a deletion: shifted the other way
    assert follow(DRAFT, dele, False, PROMPT)["tail_predicted"] == 0
    assert follow(DRAFT, dele, True, PROMPT)["tail_predicted"] == len(dele) - 9


def test_context_realignment_uses_the_occurrence_index() -> None:
    a = [1, 2, 3, 4]
    draft = [*a, 50, *a, 60, 61, 62]
    new = [*a, 55, *a, 60, 61, 62]  # leaves at 4; its second (1 2 3 4) is the draft's second
    f = follow(draft, new, True, PROMPT)
    assert f["tail_predicted"] == 3 and f["recouplings"] == 1  # 60 61 62, not 50
    slots = context_slots(PROMPT, new)
    assert slots[9] == ((1, 2, 3, 4), 1) and slots[4] == ((1, 2, 3, 4), 0)
    # the same response under position keys: positions 5-8 equal the draft's, so it re-joins
    assert follow(draft, new, False, PROMPT)["tail_predicted"] == 3


def test_lengths_differ_and_figures_aggregate() -> None:
    short = DRAFT[:12]
    f = follow(DRAFT, short, True, PROMPT)
    assert f["predicted"] == 12 and f["tail"] == 0  # it ended first: the divergence is its end
    long = DRAFT + [5, 6]
    g = follow(DRAFT, long, False, PROMPT)
    assert g["predicted"] == 20 and g["tail"] == 1 and g["tail_predicted"] == 0
    rows = [{"step": 1, "length": 12, "follow": f}, {"step": 1, "length": 22, "follow": g},
            {"step": 2, "length": 20, "follow": follow(DRAFT, DRAFT, False, PROMPT)}]
    c = coupling_figures(rows)
    assert c["all"]["tokens"] == 54 and c["all"]["predicted"] == 52
    assert c["longest"]["responses"] == 2 and c["longest"]["tokens"] == 42
    assert c["longest"]["tail_share"] == 0.0
