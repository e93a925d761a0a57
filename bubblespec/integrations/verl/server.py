"""`BubbleSpecServer`: the Ray actor verl's load balancer routes `generate` calls to.

It answers what verl calls on a rollout server actor (`generate`, `wake_up`, `sleep`,
`clear_kv_cache`, `abort_all_requests`, `resume_generation`, `set_global_steps`, ...) and
two calls of its own: `begin_step` (the next-batch hook announces a step and its next
batch) and `update_weights` (the trainer's adapter pushes a checkpoint directory).

One server fronts the whole bubblespec cluster: a step is sharded over every rank by the
gateway, so all of verl's replicas share this one named actor (`SERVER_NAME`), and the
load balancer sees one server. Unless `settings.gateway` names a running gateway, the
actor starts the cluster itself on the Ray cluster it runs in (`RayCluster`: a synchronizer,
the ranks on their own bundles, a gateway) and stops it in `shutdown`.

`generate` returns verl's `TokenOutput`: the sample's token ids, its log-probs when asked
for, `stop_reason` "completed" (stop or length) or "aborted", and in `extra_fields` the
global step of the weights, the bubblespec step, and the engine's record of the sample
(`SampleMeta`'s keys: weight version, speculative and divergence counters).
"""

from __future__ import annotations

import logging
from typing import Any

from bubblespec.batching import Step
from bubblespec.client import AsyncBubbleSpecClient
from bubblespec.integrations.verl.batcher import submit, verl_batcher, verl_sampling
from bubblespec.integrations.verl.settings import BubbleSpecSettings
from bubblespec.protocol.gateway import RolloutResponse

log = logging.getLogger("bubblespec.integrations.verl")


def step_summary(res: RolloutResponse) -> dict[str, Any]:
    """What the server keeps of a step: its number, size, counters, wall time, warnings."""
    return {"step": res.step, "prompts": len(res.prompts),
            "samples": sum(len(p.samples) for p in res.prompts), "wall_s": res.wall_s,
            "counters": res.counters.model_dump(), "warnings": list(res.warnings)}


class BubbleSpecServer:
    """verl's rollout server for a bubblespec cluster (module docstring)."""

    def __init__(self, settings: dict[str, Any], model_path: str, ranks: int, tp: int,
                 response_length: int) -> None:
        self.settings = BubbleSpecSettings.model_validate(settings)
        s = self.settings
        self.cluster: Any = None
        if s.gateway:
            url = s.gateway
        else:
            from bubblespec.cluster.ray import RayCluster

            self.cluster = RayCluster(
                ranks=ranks, model=model_path, tp=tp, rank_args=s.rank_args,
                gateway_args=s.gateway_args, sync_args=s.sync_args, name=s.cluster_name,
                token=s.token, cpus_per_bundle=s.cpus_per_bundle, log_dir=s.log_dir,
                start_timeout_s=s.start_timeout_s).start()
            url = self.cluster.gateway_url
        self.url = url
        self.response_length = response_length
        self.client = AsyncBubbleSpecClient(url, token=s.token, timeout_s=s.request_timeout_s)
        self.batcher = verl_batcher(self._rollout, linger_s=s.linger_s, idle_s=s.idle_s)
        self.global_steps: int | None = None

    async def _rollout(self, step: Step) -> RolloutResponse:
        return await self.client.rollout(
            [list(p) for p in step.prompts], n=step.n, sampling_params=step.sampling,
            next_prompts=step.next_prompts, return_logprobs=True, pregen=self.settings.pregen,
            pregen_window=self.settings.pregen_window)

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None, video_data: Any = None,
                       audio_data: Any = None, mm_processor_kwargs: Any = None,
                       priority: int = 0, **kwargs: Any) -> Any:
        """One trajectory's generation, run as a sample of the current step."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError("bubblespec rollouts are text-only (no image, video or audio data)")
        if kwargs:
            raise ValueError(f"generate: unsupported arguments {sorted(kwargs)}")
        sp, logprobs = verl_sampling(sampling_params, self.response_length,
                                     self.settings.seed_mode)
        step, s = await submit(self.batcher, prompt_ids, sp, request_id)
        extra = {"global_steps": self.global_steps, "bubblespec_step": step,
                 **s.meta.model_dump()}
        stop = "aborted" if s.finish_reason == "abort" else "completed"
        return TokenOutput(token_ids=list(s.output_ids),
                           log_probs=list(s.output_logprobs or []) if logprobs else None,
                           stop_reason=stop, extra_fields=extra)

    async def begin_step(self, count: int, next_prompts: list[Any] | None = None) -> None:
        """The next `count` generate calls are one step; `next_prompts` (the next batch's
        prompt ids, or a list of the next batches') are pre-generated."""
        self.batcher.expect(count, next_prompts)

    def steps(self, last: int = 16) -> list[dict[str, Any]]:
        """The last steps run: number, size, the gateway's counters, warnings."""
        return [step_summary(r) for r in list(self.batcher.steps)[-last:]]

    # ------------------------------------------------------------------ weights

    async def update_weights(self, path: str, version: int,
                             global_steps: int | None = None) -> dict[str, Any]:
        """Reload every rank from the checkpoint directory `path` as `version`."""
        res = await self.client.update_weights(path, version=version)
        self.global_steps = global_steps
        return res.model_dump()

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # ------------------------------------------------------------------ verl's control calls

    async def abort_all_requests(self, reset_prefix_cache: bool = True,
                                 reject_request: bool = False) -> dict[str, Any]:
        """Hold back batches not yet started until `resume_generation`. A step already at
        the gateway runs to its end: the gateway has no abort (nothing is dropped)."""
        self.batcher.pause()
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        self.batcher.resume()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """No-op: the ranks keep their weights and KV cache on their own devices."""

    async def sleep(self) -> None:
        """No-op: the ranks stay up (pre-generation may run while the trainer trains)."""

    async def clear_kv_cache(self) -> None:
        """No-op: each rank's engine resets its prefix cache on a weight reload."""

    async def release_kv_cache(self) -> None:
        """No-op (see `sleep`)."""

    async def resume_kv_cache(self) -> None:
        """No-op (see `wake_up`)."""

    async def wait_for_requests_to_drain(self) -> None:
        """No-op: a step returns only when all of its samples are done."""

    async def start_profile(self, **kwargs: Any) -> None:
        """No-op: profile the ranks with their own tools (`/metrics`, step timelines)."""

    async def stop_profile(self) -> None:
        """No-op (see `start_profile`)."""

    def gateway_url(self) -> str:
        return self.url

    async def shutdown(self) -> None:
        """Stop the cluster this actor started (the gateway's client first)."""
        await self.client.close()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
