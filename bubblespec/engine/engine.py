"""Async rollout engine: vLLM `AsyncLLM` with bubblespec drafts, token-in/token-out.

One engine per rank. `generate` runs a batch (each request expanded to `n` seeded
sub-requests so that every sample has its own seed and sample index), returns output ids,
the target model's log-probs of the emitted tokens, finish reasons and per-request
counters, and can be stopped early by a caller hook polled every `poll_every` decode steps
(partial outputs are returned). `update_weights` reloads safetensors in place and bumps
the weight version that every output is tagged with; it is transactional: the checkpoint is
validated first (`checkpoint.py`, in a thread) against the manifest of the model the engine
started with, versions only go up (unless forced), and a reload that fails after validation
puts the last good checkpoint back. `alive` says whether the engine core still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bubblespec.core.batch import DraftCounters
from bubblespec.core.sources import parse_sources
from bubblespec.engine import vllm_glue
from bubblespec.engine.checkpoint import (
    CheckpointError,
    check_bucket,
    missing_tensors,
    read_manifest,
    validate_checkpoint,
)
from bubblespec.engine.config import EngineConfig
from bubblespec.engine.sampling import vllm_sampling, vllm_scoring
from bubblespec.engine.types import (
    WEIGHT_GROUP_BACKEND,
    BatchProgress,
    GenRequest,
    GenResult,
    SampleResult,
    SpecMode,
)
from bubblespec.engine.validate import bad_token, validate_request
from bubblespec.protocol.errors import ApiError, InvalidRequest
from bubblespec.protocol.keys import group_token, make_request_id
from bubblespec.protocol.limits import MAX_WEIGHT_VERSION, clamp_logprob
from bubblespec.protocol.sample import SampleMeta

log = logging.getLogger(__name__)

StopHook = Callable[[], Awaitable[bool]]
Observer = Callable[[int, list[int], "list[dict[int, float]] | None"], None]


def default_model_dir() -> str:
    from bubblespec.tasks import default_model_dir as d

    return str(d())


@dataclass
class _Sub:
    req_index: int
    sample_index: int
    rid: str
    ids: list[int]
    logprobs: list[float]
    finish: str = "running"
    steps_seen: int = 0
    top: list[dict[int, float]] | None = None
    prompt: list[float | None] | None = None
    """A scoring request's prompt log-probs as they arrive (None: a generation request)."""
    prompt_ranks: list[int | None] | None = None
    prompt_top: list[dict[int, float] | None] | None = None
    """A scoring request's prompt ranks and, with top log-probs asked, its alternatives."""

    def add_prompt(self, ids: list[int], lps: list[Any]) -> None:
        """vLLM's prompt log-probs of the next positions (each None, or {token id: Logprob}
        holding the prompt token's first, then the most likely tokens'); the first prompt
        token's are None (no context)."""
        assert self.prompt is not None and self.prompt_ranks is not None
        for pos, lp in enumerate(lps, len(self.prompt)):
            own = None if lp is None or pos == 0 else lp[ids[pos]]
            self.prompt.append(None if own is None else float(own.logprob))
            self.prompt_ranks.append(None if own is None else int(own.rank))
            if self.prompt_top is not None:
                self.prompt_top.append(None if own is None else
                                       {int(t): float(x.logprob) for t, x in lp.items()})


class RolloutEngine:
    """One vLLM engine plus bubblespec's proposer. Create with `await RolloutEngine.start()`."""

    def __init__(self, cfg: EngineConfig, llm: Any, vocab_size: int, max_model_len: int,
                 model_dir: str) -> None:
        self.cfg = cfg
        self.llm = llm
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.model_dir = model_dir
        self.manifest = read_manifest(model_dir)
        """Names, dtypes and shapes of the model's tensors (what a checkpoint must match)."""
        self.weight_version = 0
        self.last_good_path = model_dir
        """The last checkpoint loaded from disk (the start model dir until a reload)."""
        self.last_good_version = 0
        """The version of `last_good_path` (a restarted engine comes back on it: weights
        pushed over a process group since then are not on disk)."""
        self.weight_groups: set[str] = set()
        """The trainer's weight groups this engine joined (slime: one per pipeline stage)."""
        self.pending_version: int | None = None
        """The version of the push being staged (None: nothing staged)."""
        self.tokens_generated = 0
        """Output tokens of every request so far (a progress counter for time splits)."""
        self.drafts_dropped = 0
        """Drafts refused by `add_drafts` for token ids outside the vocabulary."""
        self._gen_count = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._weights_lock = asyncio.Lock()

    @classmethod
    async def start(cls, cfg: EngineConfig) -> RolloutEngine:
        """Start vLLM (about 15 s on CPU with eager mode) and configure the proposer."""
        vllm_glue.check_vllm_version()
        vllm_glue.set_cpu_env(cfg.kv_cache_gib, cfg.kv_cache_mib, cfg.cpu_threads)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        model = cfg.model or default_model_dir()
        spec = None
        if cfg.spec_mode != SpecMode.NONE:
            spec = {"method": "custom_class",
                    "model": "bubblespec.engine.proposer.BubbleSpecProposer",
                    "num_speculative_tokens": cfg.num_speculative_tokens}
        args = AsyncEngineArgs(
            model=model, skip_tokenizer_init=False, enforce_eager=cfg.enforce_eager,
            max_model_len=cfg.max_model_len or None, dtype=cfg.dtype, seed=cfg.seed,
            max_num_seqs=cfg.max_num_seqs, speculative_config=spec,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            worker_extension_cls="bubblespec.engine.worker_extension.WorkerExtension",
            weight_transfer_config={"backend": WEIGHT_GROUP_BACKEND},
            enable_prefix_caching=True,
            kv_cache_memory_bytes=cfg.kv_cache_mib * 2**20 if cfg.kv_cache_mib else None)
        t0 = time.monotonic()
        # in a thread: starting takes seconds, and a rank keeps answering its health probes
        llm = await asyncio.to_thread(vllm_glue.start_llm, AsyncLLM, args, cfg.engine_in_one_process)
        vocab = int(llm.model_config.get_vocab_size())
        eng = cls(cfg, llm, vocab, int(llm.model_config.max_model_len), model)
        await llm.collective_rpc("bubblespec_install_keyed", args=(cfg.fault_context_only_keys,))
        if cfg.fault_poison_token >= 0:
            await llm.collective_rpc("bubblespec_install_poison", args=(cfg.fault_poison_token,))
        if cfg.pace != "off":
            overlap = cfg.pace_async_baseline and spec is None
            await llm.collective_rpc("bubblespec_install_pace",
                                     args=(cfg.pace, cfg.pace_scale, cfg.pace_charge_drafting,
                                           overlap, cfg.pace_keyed_kernel))
        if spec is not None:
            await llm.collective_rpc("bubblespec_configure", args=(eng.proposer_options(),))
        log.info("engine started in %.1f s (model %s, spec %s)", time.monotonic() - t0,
                 model, cfg.spec_mode.value)
        return eng

    def proposer_options(self) -> dict:
        """What `bubblespec_configure` passes to the proposer (from the engine config)."""
        c = self.cfg
        return {"mode": c.spec_mode.value,
                "sources": list(c.sources),
                "defer_appends": c.defer_appends,
                "draft": {"max_spec_tokens": c.num_speculative_tokens,
                          "max_spec_factor": c.max_spec_factor,
                          "max_spec_offset": c.max_spec_offset,
                          "min_token_prob": c.min_token_prob,
                          "budget_profile": c.draft_budget_profile},
                "token_budget": c.index_token_budget,
                "global_token_budget": c.global_token_budget,
                "fault_biased_verifier": c.fault_biased_verifier}

    async def set_sources(self, sources: Iterable[str] | str,
                          defer_appends: bool | None = None) -> None:
        """Switch the draft sources (`core.sources` names) between batches; resets the draft
        index. `defer_appends` None keeps the configured one."""
        upd: dict[str, Any] = {"sources": parse_sources(sources)}
        if defer_appends is not None:
            upd["defer_appends"] = defer_appends
        self.cfg = self.cfg.model_copy(update=upd)
        if self.speculative:
            await self.llm.collective_rpc("bubblespec_configure",
                                          args=(self.proposer_options(),))

    @property
    def speculative(self) -> bool:
        return self.cfg.spec_mode != SpecMode.NONE

    # ------------------------------------------------------------------ drafts
    async def add_drafts(self, items: list[tuple]) -> int:
        """Push pre-generated responses (group key, sample index, token ids[, branch
        position: a margin branch of that sample's draft, None for the draft]) into the
        index.

        A draft holding an id outside the vocabulary (from a rank with another tokenizer, or
        a buggy client of the draft store) is dropped and counted in `drafts_dropped`: its
        embedding lookup would fail the engine step of every request in the batch."""
        if self.cfg.spec_mode != SpecMode.BUBBLESPEC or not items:
            return 0
        payload = []
        for g, s, ids, *branch in items:  # (group, sample, ids[, branch_at])
            if bad_token(ids, self.vocab_size) is None:
                at = branch[0] if branch else None
                payload.append((group_token(g), int(s), [int(t) for t in ids],
                                None if at is None else int(at)))
        if len(payload) < len(items):
            self.drafts_dropped += len(items) - len(payload)
            log.warning("dropped %d drafts with token ids outside [0, %d)",
                        len(items) - len(payload), self.vocab_size)
        if not payload:
            return 0
        res = await self.llm.collective_rpc("bubblespec_add_drafts", args=(payload,))
        return int(res[0])

    async def release_groups(self, groups: list[str]) -> None:
        """Forget the drafts and outputs of these prompt groups (end of a step)."""
        if self.speculative and groups:
            await self.llm.collective_rpc("bubblespec_release",
                                          args=([group_token(g) for g in groups],))

    async def index_stats(self) -> dict[str, int]:
        """The proposer's draft-index fill level (empty without speculation)."""
        if not self.speculative:
            return {}
        return dict((await self.llm.collective_rpc("bubblespec_index_stats"))[0])

    async def heap_stats(self) -> dict[str, int]:
        """The worker process's memory split (`heap.HeapProbe.snapshot`; any spec mode)."""
        return dict((await self.llm.collective_rpc("bubblespec_heap_stats"))[0])

    async def pace_stats(self) -> dict[str, Any]:
        """The paced forwards' counters (`pace.PaceStats`; empty when not paced)."""
        if self.cfg.pace == "off":
            return {}
        return dict((await self.llm.collective_rpc("bubblespec_pace_stats"))[0])

    async def source_stats(self, reset: bool = False) -> dict[str, int]:
        """Per draft source (aligned pre-generated response, prompt group, global pool): engine
        steps it won, its drafted and accepted tokens (empty without speculation)."""
        if not self.speculative:
            return {}
        return dict((await self.llm.collective_rpc("bubblespec_source_stats",
                                                   args=(reset,)))[0])

    # ------------------------------------------------------------------ weights
    def _check_version(self, version: int | None, force: bool) -> int:
        """The version a reload would set; 409 (field version) if it does not go up."""
        new = self.weight_version + 1 if version is None else int(version)
        if not 0 <= new <= MAX_WEIGHT_VERSION:
            raise ApiError(422, f"version {new} is outside 0..{MAX_WEIGHT_VERSION}", "version")
        if new <= self.weight_version and not force:
            raise ApiError(409, f"version {new} is not newer than the loaded version "
                                f"{self.weight_version} (set force to load it anyway)",
                           "version")
        return new

    async def update_weights(self, path: str, version: int | None = None,
                             force: bool = False) -> int:
        """Validate a safetensors directory, then reload it between batches; returns the new
        version (default: current + 1). Refusals leave the engine on its weights: 409 (field
        version) for a version that does not go up without `force`, 422 (field path) for
        a checkpoint that does not match the model; 500 if vLLM's reload itself fails (the
        last good checkpoint is loaded back), 503 if the engine died doing it."""
        self._check_version(version, force)
        try:
            await asyncio.to_thread(validate_checkpoint, path, self.manifest)
        except CheckpointError as e:
            raise ApiError(422, f"checkpoint refused (weights stay at version "
                                f"{self.weight_version}): {e}", "path") from None
        async with self._weights_lock:
            await self._idle.wait()
            new = self._check_version(version, force)  # another update may have run meanwhile
            try:
                await vllm_glue.reload_weights(self.llm, path)
            except Exception as e:  # noqa: BLE001 (vLLM's loader raises anything)
                await self._roll_back(path, e)
            await self.llm.reset_prefix_cache()
            self.weight_version = self.last_good_version = new
            self.last_good_path = path
        return self.weight_version

    async def _roll_back(self, path: str, error: BaseException) -> None:
        """After a failed reload of a validated checkpoint (or of a pushed one): load the
        last good checkpoint back, with its version, and raise the 5xx that says what
        happened."""
        log.error("reload of %s failed: %s", path, error)
        if not self.alive:
            raise ApiError(503, f"the engine died reloading {path} ({error}); the rank "
                                "restarts it with the last good weights", "path")
        try:
            await vllm_glue.reload_weights(self.llm, self.last_good_path)
            await self.llm.reset_prefix_cache()
            self.weight_version = self.last_good_version
        except Exception as e2:  # noqa: BLE001
            raise ApiError(500, f"reload of {path} failed ({error}), and so did reloading "
                                f"the last good weights {self.last_good_path} ({e2})",
                           "path") from None
        raise ApiError(500, f"reload of {path} failed ({error}); back on "
                            f"{self.last_good_path} (version {self.weight_version})", "path")

    async def restore(self, path: str, version: int) -> None:
        """Put a checkpoint that was loaded before back (after an engine restart) with its
        version; the start model dir needs no reload."""
        if path != self.model_dir:
            async with self._weights_lock:
                await vllm_glue.reload_weights(self.llm, path)
                await self.llm.reset_prefix_cache()
            self.last_good_path = path
        self.weight_version = self.last_good_version = version

    # ------------------------------------------------------ memory (colocated trainers)
    async def release_memory(self) -> None:
        """vLLM's sleep (level 1: weights offloaded, KV cache dropped) between batches; on
        CPU vLLM's worker ignores it (nothing to free), the ordering and refusals stand."""
        await self._idle.wait()
        await vllm_glue.sleep(self.llm)

    async def resume_memory(self, tags: list[str] | None) -> None:
        """vLLM's wake-up of `tags` (None: all)."""
        await vllm_glue.wake_up(self.llm, tags)

    # ------------------------------------------------------ process-group weight pushes
    async def open_weight_group(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's named gloo group (`weight_group.py`; other groups stay open);
        a group of that name is left first, and what was staged is dropped unless another
        group is open (a trainer starting over). Blocks until every member joined or the
        group's deadline (an error: 504 field master_address)."""
        name = str(init_info.get("group_name"))
        if name in self.weight_groups or not self.weight_groups:
            await self._discard_staged()
        self.weight_groups.discard(name)
        try:
            await vllm_glue.open_weight_transfer(self.llm, init_info)
        except Exception as e:  # noqa: BLE001 (the store's and gloo's errors vary)
            self._check_alive(e, "joining the weight group")
            raise ApiError(504, f"could not join weight group {init_info.get('group_name')!r} "
                                f"at {init_info.get('master_address')}:"
                                f"{init_info.get('master_port')}: {e}", "master_address") from None
        self.weight_groups.add(name)

    async def close_weight_group(self, name: str | None = None) -> None:
        """Leave group `name` (what is staged stays while another group is open), or every
        group and drop what is staged (`name` None); idempotent."""
        if name is not None:
            self.weight_groups.discard(name)
            await self.llm.collective_rpc("bubblespec_close_weight_group", args=(name,))
            if not self.weight_groups:
                await self._discard_staged()
            return
        self.pending_version = None
        self.weight_groups = set()
        await vllm_glue.close_weight_transfer(self.llm)

    def _push_version_refusal(self, version: int) -> str | None:
        """Why a pushed piece of `version` cannot be staged (None: it can): versions only
        go up, and every piece of one push has the push's version."""
        if version <= self.weight_version:
            return f"version {version} is not newer than the loaded {self.weight_version}"
        if self.pending_version not in (None, version):
            return (f"version {version} differs from the push being staged "
                    f"({self.pending_version}); every piece of a push has one version")
        return None

    async def receive_bucket(self, names: list[str], dtypes: list[str],
                             shapes: list[list[int]], version: int,
                             group_name: str = "bubblespec") -> int:
        """Receive one bucket of a push into staging (the model is untouched until
        `commit_weights`); how many tensors are staged now. A bucket the model cannot take
        (422 naming names/dtypes/shapes) or whose version does not go up (409) is still
        received in full, so that the trainer's broadcast completes and the group stays in
        step; a broken broadcast (a dead trainer) drops the staged push and closes the group
        (502)."""
        if group_name not in self.weight_groups:
            raise ApiError(409, f"weight group {group_name!r} is not open on this rank: open "
                                "it first", "group_name")
        refusal = check_bucket(names, dtypes, shapes, self.manifest)
        if refusal is None and (why := self._push_version_refusal(version)) is not None:
            refusal = ("weight_version", why)
        info = {"names": names, "dtype_names": dtypes, "shapes": shapes,
                "discard": refusal is not None, "group_name": group_name}
        async with self._weights_lock:
            try:
                await vllm_glue.receive_weight_bucket(self.llm, info)
            except Exception as e:  # noqa: BLE001
                self._check_alive(e, "receiving weights")
                if "non-finite" in str(e):  # received in full: the group is in step
                    await self._discard_staged()
                    raise ApiError(422, f"push refused, nothing applied: {e}", "names") from None
                await self._drop_push(group_name)
                raise ApiError(502, f"the push broke off mid-bucket ({type(e).__name__}: {e}); "
                                    "nothing of it was applied, weights stay at version "
                                    f"{self.weight_version}; the group is closed: open it "
                                    "again", "group_name") from None
        if refusal is not None:
            field, why = refusal
            status = 409 if field == "weight_version" else 422
            raise ApiError(status, f"bucket refused (received and dropped; weights stay at "
                                   f"version {self.weight_version}): {why}", field)
        self.pending_version = version
        return len(await self._staged())

    async def receive_tensors(self, text: str, load_format: str | None,
                              version: int) -> tuple[int, bool]:
        """Stage tensors a colocated trainer handed over (SGLang's
        `/update_weights_from_tensor`; `tensor_handles.py`) beside what is staged of the same
        push; (tensors staged, whether they now cover the model). No group is needed: the
        tensors are in shared memory. Refused with nothing staged: a version that does not
        go up or differs from the push being staged (409), tensors that cannot be read or do
        not fit the model (422 naming the field)."""
        if (why := self._push_version_refusal(version)) is not None:
            raise ApiError(409, f"tensors refused (weights stay at version "
                                f"{self.weight_version}): {why}", "weight_version")
        manifest = {k: [v.dtype, list(v.shape)] for k, v in self.manifest.items()}
        async with self._weights_lock:
            try:
                res = (await self.llm.collective_rpc(
                    "bubblespec_stage_tensors", args=(text, load_format, manifest)))[0]
            except Exception as e:  # noqa: BLE001
                self._check_alive(e, "staging handed-over tensors")
                raise ApiError(422, f"tensors refused, nothing applied: {e}",
                               "serialized_named_tensors") from None
        if "refused" in res:
            field, why = res["refused"]
            raise ApiError(422, f"tensors refused (nothing of them staged; weights stay at "
                                f"version {self.weight_version}): {why}", field)
        self.pending_version = version
        staged = await self._staged()
        return len(staged), missing_tensors(staged, self.manifest) is None

    async def commit_weights(self) -> int:
        """Load the staged push into the model at once, between batches, and take its
        version; refused (422, nothing applied, the staged push dropped) when it does not
        cover every tensor of the model. A load that fails puts the last checkpoint back."""
        async with self._weights_lock:
            if self.pending_version is None:
                raise ApiError(409, "no pushed weights are staged on this rank",
                               "weight_version")
            staged = await self._staged()
            missing = missing_tensors(staged, self.manifest)
            if missing is not None:
                await self._discard_staged()  # the group stays open
                raise ApiError(422, f"push refused, nothing applied (weights stay at version "
                                    f"{self.weight_version}): {missing}", "names")
            await self._idle.wait()
            try:
                await self.llm.collective_rpc("bubblespec_commit_weights")
            except Exception as e:  # noqa: BLE001 (vLLM's loader raises anything)
                self.pending_version = None
                await self._roll_back("the pushed weights", e)  # raises
            await self.llm.reset_prefix_cache()
            self.weight_version, self.pending_version = self.pending_version, None
        return self.weight_version

    async def _staged(self) -> list[str]:
        """The names staged in the (first) worker: what a commit would load."""
        return (await self.llm.collective_rpc("bubblespec_staged_weights"))[0]

    async def discard_push(self) -> None:
        """Forget the staged push (the group stays open)."""
        await self._discard_staged()

    async def _discard_staged(self) -> None:
        """Forget the staged push (the group stays open)."""
        self.pending_version = None
        with contextlib.suppress(Exception):
            await self.llm.collective_rpc("bubblespec_discard_weights")

    async def _drop_push(self, group_name: str) -> None:
        """Forget the staged push and leave the group (after a broken broadcast)."""
        await self._discard_staged()
        with contextlib.suppress(Exception):
            await self.close_weight_group(group_name)

    def _check_alive(self, error: BaseException, what: str) -> None:
        if not self.alive:
            raise ApiError(503, f"the engine died {what} ({error}); the rank restarts it "
                                "with the last checkpoint", "engine")

    @property
    def alive(self) -> bool:
        """False once the engine core died (or the engine was shut down)."""
        return self.llm is not None and not self.llm.errored

    def dead_reason(self) -> str:
        """Why the engine is not alive (empty when it is)."""
        if self.llm is None:
            return "engine shut down"
        if not self.llm.errored:
            return ""
        err = self.llm.dead_error
        return f"{type(err).__name__}: {err}".rstrip(": ")

    # ------------------------------------------------------------------ generate
    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer as vLLM loaded it (its tool parsers and structured-output
        backends take it)."""
        return self.llm.tokenizer

    def validate(self, req: GenRequest) -> None:
        """InvalidRequest naming the first field of `req` this engine cannot run
        (`validate.validate_request`: vocabulary, model length, one seed per sample; a
        structured-output constraint vLLM's backend cannot build, bad words that do not
        tokenize)."""
        validate_request(req, self.vocab_size, self.max_model_len)
        s = req.sampling
        if (s.structured is not None or s.bad_words) and not req.score:
            seed = req.seeds[0] if req.seeds else None
            refused = vllm_glue.check_sampling(self.llm, vllm_sampling(s, seed))
            if refused is not None:
                param, why = refused
                bad_words = param == "bad_words" or s.structured is None
                raise InvalidRequest("sampling_params.bad_words" if bad_words
                                     else "sampling_params.structured", why)

    async def generate(self, requests: list[GenRequest], should_stop: StopHook | None = None,
                       poll_every: int = 8, counters: bool = True,
                       observe: Observer | None = None,
                       validated: bool = False,
                       progress: BatchProgress | None = None) -> list[GenResult]:
        """Run a batch; with `should_stop`, poll it every `poll_every` decode steps and abort
        the unfinished samples when it says so (their partial outputs are returned).
        `counters=False` skips fetching the per-request draft counters (one engine RPC per
        call; pre-generation runs each task as its own call and does not use them).
        `observe(sample index, ids so far, top log-probs so far or None)` is called as each
        sample's tokens arrive (pre-generation streams its margin branches from it).
        `progress`, when given, follows the batch's running sequences and their context as
        tokens arrive (a rank's tail-fill reads it while the batch decodes).

        Each request is checked with `validate` (InvalidRequest) before anything runs, unless
        `validated`: the caller checked them at the edge they came in by (the rank's HTTP
        handlers do, to name the field as the request spells it)."""
        if not validated:
            for req in requests:
                self.validate(req)
        async with self._weights_lock:
            self._gen_count += 1
            self._idle.clear()
        try:
            return await self._generate(requests, should_stop, poll_every, counters, observe,
                                        progress)
        finally:
            self._gen_count -= 1
            if self._gen_count == 0:
                self._idle.set()

    async def _generate(self, requests: list[GenRequest], should_stop: StopHook | None,
                        poll_every: int, counters: bool = True,
                        observe: Observer | None = None,
                        shape: BatchProgress | None = None) -> list[GenResult]:
        from vllm.inputs import TokensPrompt

        version = self.weight_version
        subs: list[_Sub] = []
        tasks = []
        progress = asyncio.Event()

        async def run(sub: _Sub, prompt: Any, sp: Any) -> None:
            if shape is None:
                return await decode(sub, prompt, sp)
            plen = len(prompt["prompt_token_ids"])
            shape.start(plen, sp.max_tokens or 0)
            try:
                await decode(sub, prompt, sp)
            finally:
                shape.ended(plen + len(sub.ids))

        async def decode(sub: _Sub, prompt: Any, sp: Any) -> None:
            async for out in self.llm.generate(prompt, sp, request_id=sub.rid):
                if sub.prompt is not None:  # scoring: the prompt's log-probs, no output
                    if out.prompt_logprobs:
                        sub.add_prompt(prompt["prompt_token_ids"], out.prompt_logprobs)
                    progress.set()
                    if out.finished:
                        sub.finish = "length"
                    continue
                comp = out.outputs[0]
                sub.ids.extend(comp.token_ids)
                self.tokens_generated += len(comp.token_ids)
                if shape is not None:
                    shape.grew(len(comp.token_ids))
                if comp.logprobs:  # NaN / -inf (every token masked) as MIN_LOGPROB
                    sub.logprobs.extend(clamp_logprob(
                        next(iter(lp.values())).logprob if len(lp) == 1 else lp[t].logprob)
                        for t, lp in zip(comp.token_ids, comp.logprobs))
                    if sub.top is not None:
                        sub.top.extend({int(t): clamp_logprob(x.logprob)
                                        for t, x in lp.items()} for lp in comp.logprobs)
                sub.steps_seen += 1
                if observe is not None:
                    observe(sub.sample_index, sub.ids, sub.top)
                progress.set()
                if out.finished:
                    sub.finish = comp.finish_reason or "stop"

        score_groups = []
        for ri, req in enumerate(requests):
            s = req.sampling
            prompt = TokensPrompt(prompt_token_ids=list(req.input_ids))
            uid = uuid.uuid4().hex[:12]
            if req.score:  # a group of its own: no drafts from, nor into, any other group
                group = f"score.{uid}"
                score_groups.append(group)
                sub = _Sub(ri, 0, make_request_id(group, 0, uid), [], [], prompt=[],
                           prompt_ranks=[], prompt_top=[] if req.top_logprobs else None)
                subs.append(sub)
                tasks.append(asyncio.create_task(run(sub, prompt,
                                                     vllm_scoring(req.top_logprobs))))
                continue
            for j in range(req.n):
                sample_index = req.sample_offset + j
                seed = req.seeds[j] if req.seeds else None
                sp = vllm_sampling(s, seed, req.keyed_start, req.top_logprobs)
                sub = _Sub(ri, sample_index, make_request_id(req.group_key(), sample_index,
                                                             f"{uid}{j}"), [], [],
                           top=[] if req.top_logprobs else None)
                subs.append(sub)
                tasks.append(asyncio.create_task(run(sub, prompt, sp)))
        stopped = False
        if should_stop is not None:
            stopped = await self._watch(subs, tasks, progress, should_stop, poll_every)
        try:
            await asyncio.gather(*tasks, return_exceptions=stopped)
        finally:
            await self.release_groups(score_groups)
        if stopped:
            for sub in subs:
                if sub.finish == "running":
                    sub.finish = "abort"
        return await self._collect(requests, subs, version, counters)

    async def _watch(self, subs: list[_Sub], tasks: list, progress: asyncio.Event,
                     should_stop: StopHook, poll_every: int) -> bool:
        """Poll `should_stop` every `poll_every` engine steps; abort all on True."""
        next_poll = poll_every
        while not all(t.done() for t in tasks):
            progress.clear()
            steps = max((s.steps_seen for s in subs), default=0)
            if steps >= next_poll:
                next_poll = steps + poll_every
                if await should_stop():
                    await self.llm.abort([s.rid for s in subs if s.finish == "running"])
                    for t in tasks:
                        if not t.done():
                            t.cancel()
                    return True
            waiter = asyncio.create_task(progress.wait())
            await asyncio.wait([waiter, *[t for t in tasks if not t.done()]],
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        return False

    async def _collect(self, requests: list[GenRequest], subs: list[_Sub],
                       version: int, counters: bool = True) -> list[GenResult]:
        stats: dict[str, DraftCounters] = {}
        if self.speculative and counters:
            res = await self.llm.collective_rpc("bubblespec_pop_stats",
                                                args=([s.rid for s in subs],))
            # the engine core's serializer hands a dataclass over as its fields by name
            stats = {rid: DraftCounters.of(c) for rid, c in res[0].items()}
        results = [GenResult(r.group_key(), []) for r in requests]
        for sub in subs:
            if sub.prompt is not None:
                results[sub.req_index].samples.append(self._scored(requests[sub.req_index],
                                                                   sub, version))
                continue
            n_out = len(sub.ids)
            c = stats.get(sub.rid) or DraftCounters(steps=n_out)
            accepted = max(0, n_out - c.steps)
            diverged = 0 <= c.first_divergence < n_out
            meta = SampleMeta(
                finish_reason=sub.finish, weight_version=version, completion_tokens=n_out,
                decode_steps=c.steps, num_drafts=c.drafts, num_draft_tokens=c.draft_tokens,
                num_accepted_tokens=accepted,
                num_accepted_pregen_tokens=min(c.accepted_pregen, accepted),
                first_divergence=c.first_divergence if diverged else None,
                draft_ran_out=bool(c.ran_out) if diverged else None,
                num_accepted_after_divergence=min(c.accepted_after_divergence, accepted),
                num_recouplings=c.recouplings,
                drafts_off=requests[sub.req_index].sampling.drafts_off if self.speculative
                else ())
            results[sub.req_index].samples.append(SampleResult(
                output_ids=sub.ids, output_logprobs=sub.logprobs[:n_out],
                sample_index=sub.sample_index, meta=meta,
                top_logprobs=None if sub.top is None else sub.top[:n_out]))
        return results

    @staticmethod
    def _scored(req: GenRequest, sub: _Sub, version: int) -> SampleResult:
        """The one sample of a scoring request: its prompt log-probs and no output (the
        token vLLM had to generate is dropped, and so are its draft counters). One aborted
        (`should_stop`) has finish reason abort and no log-probs (None), never a short list
        a caller could misalign."""
        if sub.finish != "length":
            return SampleResult(output_ids=[], output_logprobs=[], sample_index=0,
                                meta=SampleMeta(finish_reason="abort", weight_version=version))
        if len(sub.prompt or []) != len(req.input_ids):
            raise RuntimeError(f"scoring request {sub.rid} ended with {len(sub.prompt or [])}"
                               f" of {len(req.input_ids)} prompt log-probs")
        return SampleResult(output_ids=[], output_logprobs=[], sample_index=0,
                            meta=SampleMeta(finish_reason="length", weight_version=version),
                            prompt_logprobs=list(sub.prompt or []),
                            prompt_ranks=list(sub.prompt_ranks or []),
                            prompt_top_logprobs=sub.prompt_top)

    async def shutdown(self) -> None:
        """Stop the engine processes (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            vllm_glue.shutdown(llm)
