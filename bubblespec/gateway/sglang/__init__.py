"""SGLang's native HTTP API on the gateway, so that slime and AReaL switch by address.

Routes (SGLang's names, bodies and answers; bodies in `bubblespec.protocol.sglang`):

- POST /generate  single or batched `input_ids`/`text`, `sampling_params` (n included),
  `return_logprob`; answers `text`, `output_ids` and `meta_info` (finish_reason,
  prompt/completion/cached tokens, `output_token_logprobs` as [logprob, token id, null],
  weight_version, and the speculation counters under `bubblespec`). Concurrent requests are
  batched into rollout steps (`gateway/steps.py`, shared with the OpenAI routes); `next_input_ids` hands the next step's
  prompts ahead. `max_new_tokens: 0` scores the prompts instead (no step, `scoring.py`):
  `input_token_logprobs` from `logprob_start_len` on;
- POST /v1/next_prompts  the next step's prompts alone, or the next steps' batches (bubblespec);
- POST /update_weights_from_disk  {model_path, weight_version}: every rank reloads;
- POST /init_weights_update_group, /update_weights_from_distributed,
  /destroy_weights_update_group, /v1/weights/commit: a trainer's push over a gloo group;
  POST /update_weights_from_tensor: tensors a colocated trainer hands over in shared memory;
  POST /release_memory_occupation, /resume_memory_occupation (`gateway/weight_groups.py`);
- POST /abort_request  {rid}: that request if still queued; {abort_all}: every queued
  request, and the running step on every rank (its unfinished samples answer with finish
  reason abort and the tokens they have, which AReaL re-sends as prompt + partial output);
- POST /pause_generation  no new step until /continue_generation; mode "abort" (SGLang's
  default) aborts as abort_all does, "retract"/"in_place" let the running step finish;
- GET|POST /flush_cache (nothing to flush: 200);
- GET /get_model_info, /get_server_info (= /server_info), /get_weight_version, /v1/loads,
  and the SGLang router's /workers (the gateway itself: slime drains through it).

The mutating routes need the gateway's bearer token when one is configured, as SGLang's
`--api-key` does. Errors are SGLang's `{"error": {"message"}}` with the gateway's `detail`
and `field` beside it; anything the caller got wrong is a 400 naming the field.

`routes.py` holds the routes, `serving.py` what /generate does; both answer from the
services the fronts share (`gateway/fronts.py`).
"""

from __future__ import annotations

from fastapi import FastAPI

from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.sglang.routes import protected, public
from bubblespec.gateway.sglang.serving import SglangServing

__all__ = ["SglangServing", "install_sglang"]


def install_sglang(app: FastAPI, fronts: FrontServices) -> None:
    """Mount the SGLang-compatible routes on the gateway's `app`."""
    app.state.sglang = SglangServing(fronts)
    app.include_router(protected)
    app.include_router(public)
