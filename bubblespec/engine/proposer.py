"""bubblespec's drafter inside vLLM (`speculative_config.method = "custom_class"`).

Runs in the engine-core process and is called once per engine step with the tokens each
request just emitted. Per request it keeps an incremental `Matcher` over its prompt
group's suffix index, which holds the pushed pre-generated responses, the live and
finished sibling responses and the prompt, and (with the global pool on) one over the global
pool of recent responses across prompts. Per step it drafts from each source and from the
aligned pre-generated response, and sends the candidate with the highest expected accepted
length (`bubblespec.core.candidates`), counting per source the steps it won and the tokens of
its drafts that were accepted (`source_stats`). It also counts, per request, forward passes,
drafts, draft tokens and accepted tokens (vLLM keeps no per-request figures), and can wrap
vLLM's own `ngram` / `suffix` proposers so the baselines are counted the same way.

The per-request loop is `bubblespec.core.batch.step`, called once per engine step for the
whole batch: one native call when `bubblespec_native` is built (`bubblespec.core.backend`).
Requests that joined are registered (prompt, live sequence, matchers) before that call,
requests that left are finished after it; while the batch keeps its requests in the same
order, the step's request list is reused as is. With ``defer_appends`` the step drafts
without first appending the tokens just emitted, and those are appended afterwards on a
worker thread (the native index releases the GIL), beside the engine's next forward; every
entry point that reads or writes the index first waits for it (`_settle`).
Drafts never affect what is sampled: vLLM verifies them (see docs/design.md section 2).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from bubblespec.core import DraftParams
from bubblespec.core.backend import Request, SuffixIndex, extend_requests, step
from bubblespec.core.batch import RESYNC, DraftCounters, take_branch
from bubblespec.core.candidates import Calibration, DrafterStats
from bubblespec.core.draft_budget import DraftBudget
from bubblespec.core.engine_time import EngineTime
from bubblespec.core.sources import parse_sources
from bubblespec.engine.faults import install_biased_verifier
from bubblespec.engine.sampling import drafts_off
from bubblespec.engine.vllm_glue import (
    VllmProposer,
    batch_view,
    install_sampler_fixes,
    max_model_len,
    num_speculative_tokens,
    request_extra_args,
    request_min_tokens,
    vocab_size,
)
from bubblespec.protocol.keys import parse_request_id

_MAX_FINISHED_STATS = 200_000
log = logging.getLogger(__name__)


class BubbleSpecProposer:
    """vLLM custom_class proposer; configured through `WorkerExtension.bubblespec_configure`."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.k = num_speculative_tokens(vllm_config)
        self.max_model_len = max_model_len(vllm_config)
        self.vocab_size = vocab_size(vllm_config)
        self.drafts_dropped = 0  # pushed drafts with ids outside the vocabulary
        self.runner: Any = None
        self.mode = "bubblespec"
        self.inner: VllmProposer | None = None
        self.pregen = self.siblings = self.self_context = True
        self.history = False
        self.global_pool = False
        self.defer_appends = False
        self._appender: ThreadPoolExecutor | None = None
        self._pending: Future | None = None  # the last step's appends, when deferred
        self.append_errors = 0
        self.params = DraftParams(max_spec_tokens=self.k)
        self.index = SuffixIndex(max_depth=64, token_budget=4_000_000)
        self.reqs: dict[str, Any] = {}  # request id -> backend Request
        self._order: list[str] | None = None  # last step's request ids, in batch order
        self._order_reqs: list[Any] = []  # and their Requests
        self.finished: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.prompts_added: set[str] = set()
        self.drafts_by_group: dict[str, list[tuple]] = {}
        self.aligned: dict[tuple[str, int], list[int]] = {}
        # margin branches per (group, sample): (branch position, tokens); and per running
        # request that has some: [its current aligned response, its branches]
        self.branches: dict[tuple[str, int], list[tuple[int, list[int]]]] = {}
        self.branching: dict[str, list] = {}
        self.branches_taken = 0
        self.history_seqs: dict[str, list[tuple]] = {}  # finished outputs kept per group
        self.calib = Calibration()
        self.src_stats = DrafterStats()
        self.budget: DraftBudget | None = None  # the per-step draft cap (`draft_budget`)
        self.acc_rej: dict[str, list[int]] = {}  # running request -> [accepted, rejections]
        self.cap_steps = self.cap_sum = 0
        self.min_tokens: dict[str, int] = {}  # running request -> its min_tokens (when > 0)
        self.drafts_off: set[str] = set()  # running requests with min_p or logit_bias
        self.undrafted_steps = 0  # request-steps they decoded without drafts
        install_sampler_fixes()

    # ------------------------------------------------------------------ control (RPC)
    def bubblespec_configure(self, options: dict) -> str:
        """Set mode ("bubblespec" | "ngram" | "suffix"), sources (`core.sources` names;
        without them: pregen, siblings and self), execution options and draft parameters."""
        self._settle()
        self.mode = options.get("mode", "bubblespec")
        if options.get("fault_biased_verifier"):  # negative control of the exactness tests
            install_biased_verifier(float(options["fault_biased_verifier"]))
        # the sources (core.sources names) as the flags the per-step code reads
        on = set(parse_sources(options.get("sources", ("pregen", "siblings", "self"))))
        self.pregen = "pregen" in on
        self.siblings = "siblings" in on
        self.self_context = "self" in on
        self.history = "history" in on
        self.global_pool = "global" in on
        # live outputs mirrored into the global pool (shared groups only: a private group
        # goes when its request ends, and its mirrors would go with it)
        self.global_live = self.global_pool and self.siblings and "global_live" in on
        self.mirrored_done: dict[str, list[tuple[Any, list[int]]]] = {}
        self.defer_appends = bool(options.get("defer_appends", False))
        if self.defer_appends and self._appender is None:
            self._appender = ThreadPoolExecutor(1, thread_name_prefix="bubblespec-appends")
        dp = options.get("draft", {})
        self.params = DraftParams(
            max_spec_tokens=min(int(dp.get("max_spec_tokens", self.k)), self.k),
            max_spec_factor=float(dp.get("max_spec_factor", 1.0)),
            max_spec_offset=float(dp.get("max_spec_offset", 0.0)),
            min_token_prob=float(dp.get("min_token_prob", 0.1)))
        profile = dp.get("budget_profile", "h100")
        self.budget = (DraftBudget(EngineTime.preset(profile), self.params.max_spec_tokens)
                       if profile and self.mode == "bubblespec" else None)
        self.cap_steps = self.cap_sum = self.undrafted_steps = 0
        self.index = SuffixIndex(
            max_depth=int(options.get("max_depth", 64)),
            token_budget=int(options.get("token_budget", 4_000_000)),
            global_token_budget=int(options.get("global_token_budget", 200_000)))
        self.calib = Calibration()
        self.src_stats = DrafterStats()
        if self.mode in ("ngram", "suffix"):
            self.inner = VllmProposer(self.vllm_config, self.mode,
                                      int(options.get("ngram_min", 2)),
                                      int(options.get("ngram_max", 5)))
        return self.mode

    def add_drafts(self, items: list[tuple]) -> int:
        """Store pre-generated responses: (group token, sample index, token ids[, branch
        position]); a margin branch (position not None) is kept beside its sample's draft
        for `core.batch.take_branch`, and its part from shortly before the branch point goes
        into the group's index like the drafts.

        A response with an id outside [0, vocab) is dropped (and counted): drafting it would
        fail the embedding lookup, and with it the engine step of every request."""
        self._settle()
        if not self.pregen:
            return 0
        n = 0
        vocab = self.vocab_size
        for gtok, sample, ids, *branch in items:
            if any(not 0 <= t < vocab for t in ids):
                self.drafts_dropped += 1
                continue
            at = branch[0] if branch else None
            if at is not None:
                if 0 <= at < len(ids):
                    self.branches.setdefault((gtok, int(sample)), []).append((int(at), list(ids)))
                    seq_id = ("branch", gtok, int(sample), int(at),
                              len(self.drafts_by_group.get(gtok, ())))
                    self.index.add_sequence(seq_id, gtok, ids[max(0, at - 16):])
                    self.drafts_by_group.setdefault(gtok, []).append(seq_id)
                    n += len(ids) - at
                continue
            seq_id = ("pre", gtok, int(sample), len(self.drafts_by_group.get(gtok, ())))
            if ids:
                self.aligned[(gtok, int(sample))] = list(ids)
                self.index.add_sequence(seq_id, gtok, ids)
                self.drafts_by_group.setdefault(gtok, []).append(seq_id)
                n += len(ids)
        return n

    def release(self, groups: list[str]) -> int:
        """A batch is over: drop its groups (keep finished outputs when history is on)."""
        self._settle()
        dropped = 0
        dead = set(groups)
        # requests still tracked (their counters never fetched) end here, before their
        # sequences go: finishing them later would name sequences the index no longer has
        for rid in [r for r in self.reqs if parse_request_id(r)[0] in dead]:
            self._finish(rid)
        # counters nobody collected (pre-generation does not) go with their group
        for base in [b for b in self.finished if parse_request_id(b)[0] in dead]:
            del self.finished[base]
        self.aligned = {k: v for k, v in self.aligned.items() if k[0] not in dead}
        self.branches = {k: v for k, v in self.branches.items() if k[0] not in dead}
        for gtok in groups:
            kept = self.mirrored_done.pop(gtok, [])
            if self.history:
                self.index.remove_sequences(self.drafts_by_group.pop(gtok, []))
            else:
                for sid, out in kept:  # the global pool keeps the finished outputs
                    self.index.add_sequence(("glob",) + sid[1:], None, out, to_global=True)
                self.drafts_by_group.pop(gtok, None)
                self.prompts_added.discard(gtok)
                if gtok in self.index.groups():
                    self.index.remove_group(gtok)
                    dropped += 1
        return dropped

    def pop_stats(self, req_ids: list[str]) -> dict[str, DraftCounters]:
        """Counters of finished requests by base id (finishing any still tracked)."""
        self._settle()
        wanted = set(req_ids)
        for rid in [r for r in self.reqs if parse_request_id(r)[2] in wanted]:
            self._finish(rid)
        return {r: self.finished.pop(r) for r in req_ids if r in self.finished}

    def index_stats(self) -> dict[str, int]:
        """Fill level of the draft index and of the per-request tables (what a soak watches),
        and the drafts dropped for ids outside the vocabulary."""
        self._settle()
        idx = self.index
        return {"groups": len(idx.groups()), "live_requests": len(self.reqs),
                "tokens": idx.num_tokens, "token_budget": idx.token_budget or 0,
                "global_tokens": idx.num_global_tokens,
                "global_token_budget": idx.global_token_budget or 0, "bytes": idx.nbytes(),
                "aligned": len(self.aligned), "finished_stats": len(self.finished),
                "drafts_dropped": self.drafts_dropped, "branches": len(self.branches),
                "branches_taken": self.branches_taken, "append_errors": self.append_errors,
                "draft_cap_rows": self.cap_steps, "draft_cap_sum": self.cap_sum,
                "drafts_off_requests": len(self.drafts_off),
                "undrafted_steps": self.undrafted_steps}

    def source_stats(self, reset: bool = False) -> dict[str, int]:
        """Per draft source: engine steps it won, its drafted and accepted tokens (and the
        steps where no source drafted), since `bubblespec_configure` or the last reset."""
        out = self.src_stats.as_dict()
        if reset:
            self.src_stats = DrafterStats()
        return out

    # ------------------------------------------------------------------ per step
    def _settle(self) -> None:
        """Wait for the last step's deferred appends. A failed append costs drafts only
        (the index misses those tokens), never the engine step: it is logged and counted."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except Exception:
            self.append_errors += 1
            log.exception("deferred draft-index appends failed")

    def _start(self, req_id: str, row: int, token_ids_cpu: Any, n_prompt: int,
               n_tokens: int) -> Any:
        gtok, sample, base = parse_request_id(req_id)
        group = gtok if self.siblings else f"{gtok}/{base}"
        prompt = token_ids_cpu[row, :n_prompt].tolist()
        if self.self_context and group not in self.prompts_added:
            self.index.add_sequence(("prompt", group), group, prompt)
            self.prompts_added.add(group)
        if not self.siblings:  # private group: copy the shared drafts it may use
            shared = (self.drafts_by_group.get(gtok, []) if self.pregen else []) + (
                self.history_seqs.get(gtok, []) if self.history else [])
            for sid in shared:
                try:
                    toks = self.index.sequence_tokens(sid)
                except ValueError:  # evicted under the token budget
                    continue
                self.index.add_sequence(("copy", group, sid), group, toks)
        least = request_min_tokens(self.runner, req_id)
        if least > 0:
            self.min_tokens[req_id] = least
        if drafts_off(request_extra_args(self.runner, req_id)):
            self.drafts_off.add(req_id)
        seq_id = ("out", base, n_tokens)
        done = token_ids_cpu[row, n_prompt:n_tokens].tolist()
        if self.siblings or self.self_context:
            self.index.add_sequence(seq_id, group, done, live=True, to_global=self.global_live)
        matcher = self.index.matcher(group, prompt + done, use_global=False)
        gmatcher = (self.index.matcher(None, prompt + done)
                    if self.global_pool and self.inner is None else None)
        aligned = self.aligned.get((gtok, sample)) if self.pregen else None
        on = aligned is not None and aligned[: len(done)] == done
        branches = self.branches.get((gtok, sample)) if aligned is not None else None
        if branches:
            self.branching[req_id] = [aligned, branches]
        return Request(group, seq_id, matcher, gmatcher, aligned=aligned, aligned_on=on,
                       tail=done[-RESYNC:], n_out=len(done),
                       out=list(done) if self.history or self.global_pool else [])

    def _finish(self, req_id: str) -> None:
        st = self.reqs.pop(req_id)
        self.acc_rej.pop(req_id, None)
        self.min_tokens.pop(req_id, None)
        self.drafts_off.discard(req_id)
        self.branching.pop(req_id, None)
        self._order = None
        gtok = parse_request_id(req_id)[0]
        if self.siblings or self.self_context:
            self.index.finish_sequence(st.seq_id)
        if self.global_live and st.out:  # mirrored already; kept past its group's release
            self.mirrored_done.setdefault(gtok, []).append((st.seq_id, st.out))
        elif self.global_pool and st.out:  # a copy in the global pool, outside every group
            self.index.add_sequence(("glob",) + st.seq_id[1:], None, st.out, to_global=True)
        if self.history and self.siblings:  # the finished output stays in the shared group
            self.history_seqs.setdefault(gtok, []).append(st.seq_id)
        elif self.history and st.out:  # keep a copy in the shared group
            hid = ("hist",) + st.seq_id[1:]
            self.index.add_sequence(hid, gtok, st.out)
            self.history_seqs.setdefault(gtok, []).append(hid)
        if not self.siblings and st.group in self.index.groups():
            self.index.remove_group(st.group)  # a private group serves one request only
            self.prompts_added.discard(st.group)
        self.finished[parse_request_id(req_id)[2]] = DraftCounters.of(st.counters)
        while len(self.finished) > _MAX_FINISHED_STATS:
            self.finished.popitem(last=False)

    def _requests(self, ids: list[str], sampled: list[list[int]], num_tokens: Any,
                  n_prompt: Any, token_ids_cpu: Any) -> list[Any]:
        """The Requests of this step in batch order, registering the requests that joined."""
        reqs = []
        for i, rid in enumerate(ids):
            st = self.reqs.get(rid)
            if st is None:
                n_done = int(num_tokens[i]) - len(sampled[i])
                st = self.reqs[rid] = self._start(rid, i, token_ids_cpu, int(n_prompt[i]),
                                                  n_done)
            reqs.append(st)
        return reqs

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
        self._settle()
        batch = batch_view(self.runner)
        ids = list(batch.req_ids[: len(sampled_token_ids)])
        fresh = ids != self._order
        reqs = (self._requests(ids, sampled_token_ids, num_tokens_no_spec,
                               batch.num_prompt_tokens, token_ids_cpu)
                if fresh else self._order_reqs)
        if self.branching:
            self._take_branches(ids, reqs, sampled_token_ids)
        inner = None
        if self.inner is not None:
            inner = self.inner.propose(self.k, sampled_token_ids, num_tokens_no_spec,
                                       token_ids_cpu, self.runner)
        extend = self.siblings or self.self_context
        defer = extend and self.defer_appends
        caps = None if inner is not None else self._caps(ids, reqs, sampled_token_ids,
                                                          num_tokens_no_spec)
        if self.min_tokens or self.drafts_off:
            caps = self._hold(ids, caps, len(sampled_token_ids), num_tokens_no_spec,
                              batch.num_prompt_tokens)
        out = step(self.index, reqs, sampled_token_ids, num_tokens_no_spec, self.k,
                   self.max_model_len, self.params, self.calib, self.src_stats,
                   extend_index=extend and not defer,
                   keep_out=self.history or self.global_pool, drafts=inner, caps=caps)
        if fresh:
            live = set(ids)
            for rid in [r for r in self.reqs if r not in live]:
                self._finish(rid)
            self._order, self._order_reqs = ids, reqs
        if defer and self._appender is not None:  # requests that left emitted nothing
            self._pending = self._appender.submit(extend_requests, self.index, reqs,
                                                  list(sampled_token_ids))
        return out

    def _caps(self, ids: list[str], reqs: list[Any], sampled: list[list[int]],
              num_tokens: Any) -> list[int] | None:
        """This step's draft cap of each request (`DraftBudget`), after learning from what
        the last step's drafts (each request's `last_draft`) gave; None without a budget."""
        if self.budget is None:
            return None
        n = len(sampled)
        emitted = np.fromiter((len(s) for s in sampled), dtype=np.int64, count=n)
        drafted = np.fromiter((r.last_draft for r in reqs[:n]), dtype=np.int64, count=n)
        self.budget.observe(drafted, emitted)
        if self.budget.under_ridge(int((emitted > 0).sum())):
            return None  # full drafts cost next to nothing: skip the per-request work
        # per request: accepted draft tokens and rejections (drafts cut short) so far; a
        # draft accepted whole (a cap that binds) has no rejection
        acc = np.minimum(np.maximum(emitted - 1, 0), drafted)
        rej = (acc < drafted) & (emitted > 0)
        seen = np.zeros((n, 2), dtype=np.int64)
        for i in np.flatnonzero((drafted > 0) & (emitted > 0)).tolist():
            tot = self.acc_rej.setdefault(ids[i], [0, 0])
            tot[0] += int(acc[i])
            tot[1] += int(rej[i])
        for i, rid in enumerate(ids):
            tot = self.acc_rej.get(rid)
            if tot is not None:
                seen[i] = tot
        live = emitted > 0
        caps = np.zeros(n, dtype=np.int64)
        caps[live] = self.budget.next_caps(self.budget.request_p(seen[live, 0], seen[live, 1]),
                                           float(np.asarray(num_tokens[:n]).sum()))
        self.cap_steps += int(live.sum())
        self.cap_sum += int(caps.sum())
        return caps.tolist()

    def _hold(self, ids: list[str], caps: list[int] | None, n: int, num_tokens: Any,
              n_prompt: Any) -> list[int]:
        """`caps` (None: k each) lowered for the requests whose drafts vLLM would not verify
        exactly, before any draft is chosen (so the counters and the acceptance statistics
        see what is sent):

        - min_p or logit_bias (`drafts_off`): no drafts. vLLM's rejection sampler does not
          apply them to drafted positions; its sampler applies them to every token it draws
          itself (`vllm_glue.install_min_p_and_logit_bias`), so these requests decode one
          token per step, as without speculation.
        - short of `min_tokens`: at most min_tokens - n - 1 draft tokens from n output
          tokens. vLLM masks the stop tokens of drafted positions before `min_tokens`
          exactly, but the bonus token of a step is masked by the output length before the
          step: a step whose bonus lies at or past min_tokens would mask the stop tokens
          there, where decoding without drafts would not. A request at or past its
          min_tokens drafts as any other."""
        out = [self.k] * n if caps is None else list(caps)
        for i, rid in enumerate(ids[:n]):
            if rid in self.drafts_off:
                out[i] = 0
                self.undrafted_steps += 1
                continue
            least = self.min_tokens.get(rid)
            if least is None:
                continue
            n_out = int(num_tokens[i]) - int(n_prompt[i])
            if n_out >= least:
                del self.min_tokens[rid]
            else:
                out[i] = min(out[i], max(least - n_out - 1, 0))
        return out

    def _take_branches(self, ids: list[str], reqs: list[Any], sampled: list[list[int]]) -> None:
        """Requests whose new tokens left their aligned response where a margin branch takes
        them follow the branch from this step on (`core.batch.take_branch`)."""
        for i, new in enumerate(sampled):
            b = self.branching.get(ids[i]) if new else None
            if b is None:
                continue
            taken = take_branch(reqs[i], b[0], new, b[1])
            if taken is not None:
                b[0] = taken
                self.branches_taken += 1

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No draft model to load."""
