"""Calibration of the simulator against paced benchmark runs: the lab's top layer.

A paced run (`bubblespec bench paced`, its record `bubblespec.bench.paced_record`) measures
the rollout on ranks whose forwards last the engine-time model's figure x a scale; the
simulator (`bubblespec.sim`) models the same steps. This package reads the paced record,
derives every simulator input from it and replays the run beside its measurement
(`replay`), measures where responses left their drafts (`flips`) and how fast their tails
decoded afterwards (`tails`), and prints the comparison and the projections from the
calibrated inputs (`report`; `bubblespec simulate --calibrate PACED_JSON`).

It sits above both the simulator and the bench, and imports them and the product; neither
of them imports it (`tests/test_layering.py`). What the simulator needs at run time (the
flip sentinel, the after-flip rates per tail-length class) stays in `bubblespec.sim`.
"""
