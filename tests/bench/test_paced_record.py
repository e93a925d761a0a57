"""The paced-run record: what `bench paced` writes is what the calibration reads."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from bubblespec.bench.paced import PacedBenchConfig
from bubblespec.bench.paced_record import SCHEMA, PacedDoc, PacedRun
from bubblespec.calibration.predict import DEFAULT_CALIBRATION

FIXTURE = DEFAULT_CALIBRATION


def _cfg(tmp_path: Path) -> PacedBenchConfig:
    return PacedBenchConfig(
        steps=2, prompts=2, n=2, seeds="0,1", epoch_steps=0, lr=1e-4, temperature=1.0,
        greedy_prompts=0, modes="nospec,bubblespec", ranks=2, pace="h100", pace_scale=10.0,
        kv_cache_mib=64, train_window_s=1.0, extra_rank_args="", model=None,
        out=str(tmp_path), timeline_step=1)


def _mode(pregen: bool, walls: list[float]) -> dict:
    return {"pregen": pregen, "seed_mode": "default", "shared_cluster": "nospec+bubblespec",
            "steps": [{"step": i, "wall_s": w, "completion_tokens": 8, "train_s": 2.0,
                       "output_lengths": [[1, 2], [3, 4]]} for i, w in enumerate(walls)]}


def test_the_writers_record_reads_back_as_the_same_run(tmp_path):
    doc = PacedDoc(config=asdict(_cfg(tmp_path)))
    doc.runs = {"0": {"nospec": _mode(False, [5.0, 10.0]), "bubblespec": _mode(True, [5.0, 5.0]),
                      "suffix": {"skipped": "arctic_inference not importable"}},
                "1": {"nospec": _mode(False, [5.0, 20.0])}}
    doc.report.update(final_line="paced_rollout_speedup_vs_nospec: ...")
    path = tmp_path / "paced.json"
    doc.write(path)
    raw = json.loads(path.read_text())
    assert list(raw) == ["schema", "config", "runs", "final_line"] and raw["schema"] == SCHEMA
    back = PacedDoc.read(path)
    assert back == doc and back.seeds_with_steps() == ["0", "1"]
    run = PacedRun.load(path)
    assert (run.ranks, run.prompts, run.n, run.steps, run.pace, run.scale, run.seeds) == (
        2, 2, 2, 2, "h100", 10.0, 2)
    assert set(run.modes) == {"nospec", "bubblespec"}  # a skipped mode recorded no steps
    assert run.modes["bubblespec"].pregen and run.modes["bubblespec"].baseline == "nospec"
    assert run.modes["nospec"].cluster == "nospec+bubblespec"
    assert run.measured("nospec") == (8.0, 1.0) and run.train_s("nospec") == 0.2
    assert PacedRun.load(path, "1").measured("nospec") == (8.0, 2.0)


def test_the_checked_in_record_loads_and_round_trips():
    raw = json.loads(FIXTURE.read_text())
    doc = PacedDoc.read(FIXTURE)
    assert doc.to_json() == raw
    assert PacedRun.of(doc, FIXTURE).modes.keys() == PacedRun.load(FIXTURE).modes.keys()


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(schema="bubblespec.bench.paced/v0"), "schema"),
    (lambda d: d["config"].pop("ranks"), "config.ranks"),
])
def test_a_bad_record_names_the_field(tmp_path, edit, field):
    raw = json.loads(FIXTURE.read_text())
    edit(raw)
    with pytest.raises(ValueError, match=field):
        PacedDoc.parse(raw, "paced.json")


def test_the_loss_aggregation_reaches_the_schedule(tmp_path):
    from dataclasses import replace

    assert _cfg(tmp_path).service_config(0).loss_agg == "seq-mean"
    cfg = replace(_cfg(tmp_path), loss_agg="token-mean")
    assert cfg.service_config(3).loss_agg == "token-mean" and cfg.service_config(3).seed == 3


def test_a_resumed_run_keeps_what_was_measured_and_refuses_another_configuration(tmp_path):
    from dataclasses import replace

    from bubblespec.bench.paced import resumed

    doc = PacedDoc(config=asdict(_cfg(tmp_path)))
    doc.runs = {"0": {"nospec": _mode(False, [5.0, 10.0]),
                      "bubblespec": {"skipped": "failed: ClusterError: r3"}}}
    more = replace(_cfg(tmp_path), modes="nospec,bubblespec,suffix", resume=True)
    assert resumed(doc, more) == {0: {"nospec": {**doc.runs["0"]["nospec"], "pace_scale": 10.0}}}
    with pytest.raises(ValueError, match="config.pace_scale"):
        resumed(doc, replace(more, pace_scale=20.0))
    older = PacedDoc(config={k: v for k, v in doc.config.items() if k != "loss_agg"},
                     runs=doc.runs)  # a record from before a key existed: its default
    assert list(resumed(older, more)[0]) == ["nospec"]


def test_a_resumed_run_measures_again_the_modes_given_another_scale(tmp_path):
    from dataclasses import replace

    from bubblespec.bench.paced import resumed

    doc = PacedDoc(config=asdict(_cfg(tmp_path)))  # a record from before per-mode scales
    doc.runs = {"0": {"nospec": _mode(False, [5.0, 10.0]),
                      "bubblespec": _mode(True, [5.0, 5.0])}}
    more = replace(_cfg(tmp_path), modes="nospec,bubblespec", mode_scales="bubblespec=40",
                   resume=True)
    kept = resumed(doc, more)
    assert list(kept[0]) == ["nospec"] and kept[0]["nospec"]["pace_scale"] == 10.0
    # the same scale again: kept, and a mode this run does not name stays as it was
    assert set(resumed(doc, replace(more, mode_scales="bubblespec=10"))[0]) == {
        "nospec", "bubblespec"}
    assert set(resumed(doc, replace(more, modes="nospec"))[0]) == {"nospec", "bubblespec"}
    # read back, each mode's modelled seconds use the scale it ran at
    doc.runs["0"]["bubblespec"]["pace_scale"] = 40.0
    doc.write(tmp_path / "paced.json")
    run = PacedRun.load(tmp_path / "paced.json")
    assert run.scale == 10.0 and run.scale_of("bubblespec") == 40.0
    assert run.measured("bubblespec") == (8.0, 0.125) and run.measured("nospec") == (8.0, 1.0)
    assert run.train_s("bubblespec") == pytest.approx(0.05)
