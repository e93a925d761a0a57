"""`bubblespec simulate`: a discrete-event model of synchronous RL rollout at scale.

Everything here is MODELLED, never measured: per-rank continuous batching over R ranks
(`rollout`), forward times from the core's engine-time model (`bubblespec.core.engine_time`,
re-exported here as `EngineTime`), pre-generation of the next step in the bubble by a
continuous batch of lanes per rank (`pregen`), acceptance figures per rollout mode
(`policy`, with the after-flip rates per tail-length class of `tails`), response lengths from
a bench dump or a labelled synthetic default (`workload`), the step loop and summaries
(`model`), the table / JSON / plot (`report`) and one `bubblespec simulate` run (`run`).
The replay of a paced benchmark run beside its measurement is `bubblespec.calibration`, a
layer above this package.
Pure Python + numpy; matplotlib only for the plot, imported when plotting.
"""

from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import SimConfig, Summary, run_scenario, simulate
from bubblespec.sim.policy import ModeSpec, default_modes
from bubblespec.sim.workload import LengthSource

__all__ = ["EngineTime", "LengthSource", "ModeSpec", "SimConfig", "Summary", "default_modes",
           "run_scenario", "simulate"]
