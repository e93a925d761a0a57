"""verl's plugin entry point: registers the `bubblespec` rollout backend when imported.

verl imports this module at the end of its own `__init__` (the `verl.plugins` entry point,
or `VERL_USE_EXTERNAL_MODULES=bubblespec.integrations.verl.plugin`), so it imports only
verl's two registry modules; the replica and adapter modules load when a run selects the
backend (`RolloutReplicaRegistry.get`, `get_rollout_class`).
"""

from __future__ import annotations

from verl.workers.rollout import base
from verl.workers.rollout.replica import RolloutReplicaRegistry

NAME = "bubblespec"
"""The value of `actor_rollout_ref.rollout.name` that selects bubblespec."""
ADAPTER = "bubblespec.integrations.verl.adapter.BubbleSpecServerAdapter"
"""verl's rollout adapter of the backend, by qualified name (loaded in trainer workers)."""


def _load_replica() -> type:
    from bubblespec.integrations.verl.replica import BubbleSpecReplica

    return BubbleSpecReplica


def register() -> None:
    """Register the backend with verl's replica registry and rollout adapter table."""
    RolloutReplicaRegistry.register(NAME, _load_replica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = ADAPTER


register()
