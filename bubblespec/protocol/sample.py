"""One sampled response's record: its finish reason, weight version and counters.

The engine fills a `SampleMeta` once per sample (`RolloutEngine._collect`) and every hop
carries that record as it is: the rank's answer (`meta_info` of a step shard's and of
/generate's samples), the gateway's `RolloutSample` (whose fields are these), the SGLang
answer (`meta_info.bubblespec`) and verl's `TokenOutput.extra_fields`. `SampleTotals` is
what a step sums of them (the per-sample part of the gateway's `RolloutCounters`).

Adding a per-sample counter: compute it in the engine, declare it here (in `SampleMeta`, and
in `SampleTotals` with its sum when a step should report it), export the sum as a metric
(`metrics/gateway.py`). Every hop above picks it up from this model.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class SampleMeta(BaseModel):
    """A sample's finish reason, weight version and counters, as the engine reported them.

    Immutable, so that what a hop forwards is what the engine filled; unknown keys are
    ignored, so that a gateway keeps reading the record of a newer rank."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    finish_reason: str = Field("", description=(
        "stop (a stop token or EOS), length (max_new_tokens), abort (the step was "
        "aborted; the tokens generated so far are returned) or error (vLLM could not go "
        "on: a structured-output constraint no token satisfies; the tokens so far)."))
    weight_version: int = Field(0, description="Weight version of the engine that sampled it.")
    completion_tokens: int = Field(0, description="Output tokens (the length of output_ids).")
    decode_steps: int = Field(0, description=(
        "Target forward passes that produced its tokens (prefill included)."))
    num_drafts: int = Field(0, description="Speculative drafts proposed for it.")
    num_draft_tokens: int = Field(0, description="Draft tokens proposed for it.")
    num_accepted_tokens: int = Field(0, description="Draft tokens the target accepted.")
    num_accepted_pregen_tokens: int = Field(0, description=(
        "Accepted draft tokens that came from the aligned pre-generated response (same "
        "prompt, sample index and seed); pre-generated tokens drafted through the suffix "
        "index are not told apart from other index drafts, so this is a lower bound of "
        "pre-generation's share."))
    first_divergence: int | None = Field(None, description=(
        "Output position where the response first left its aligned pre-generated response "
        "(a different token, or past its end); null: it had none, or never left it."))
    draft_ran_out: bool | None = Field(None, description=(
        "At first_divergence: true when the aligned response had ended there (pre-generation "
        "was stopped before finishing it), false when the output took another token (a "
        "flip); null without a first_divergence."))
    num_accepted_after_divergence: int = Field(0, description=(
        "Accepted draft tokens (any source) at or after first_divergence."))
    num_recouplings: int = Field(0, description=(
        "Times the output re-joined its aligned pre-generated response after leaving it "
        "(drafting from it resumed)."))
    drafts_off: tuple[str, ...] = Field((), description=(
        "The sampling fields that made it decode without drafts, one token per step "
        "(min_p, logit_bias: vLLM does not apply them in speculative verification): exact, "
        "not accelerated. Empty: it could draft."))


class SampleTotals(BaseModel):
    """A step's sums of its samples' `SampleMeta` counters."""

    completion_tokens: int = 0
    request_decode_steps: int = Field(0, description="Sum of per-request forward passes.")
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_pregen_tokens: int = 0
    responses_diverged: int = Field(
        0, description="Samples that left their aligned pre-generated response.")
    responses_draft_ran_out: int = Field(
        0, description="Of those, samples whose pre-generated response ended where they left "
                       "it (pre-generation stopped before finishing it; the rest flipped).")
    num_accepted_after_divergence: int = Field(
        0, description="Accepted draft tokens at or after each sample's first divergence.")
    num_recouplings: int = Field(
        0, description="Times samples re-joined their pre-generated response after leaving.")
    responses_undrafted: int = Field(
        0, description="Samples decoded without drafts for their sampling fields "
                       "(`SampleMeta.drafts_off`).")

    @staticmethod
    def sums(samples: Sequence[SampleMeta]) -> dict[str, int]:
        """The sums of `samples`, by field name."""
        return {
            "completion_tokens": sum(s.completion_tokens for s in samples),
            "request_decode_steps": sum(s.decode_steps for s in samples),
            "num_drafts": sum(s.num_drafts for s in samples),
            "num_draft_tokens": sum(s.num_draft_tokens for s in samples),
            "num_accepted_tokens": sum(s.num_accepted_tokens for s in samples),
            "num_accepted_pregen_tokens": sum(s.num_accepted_pregen_tokens for s in samples),
            "responses_diverged": sum(s.first_divergence is not None for s in samples),
            "responses_draft_ran_out": sum(bool(s.draft_ran_out) for s in samples),
            "num_accepted_after_divergence": sum(s.num_accepted_after_divergence
                                                 for s in samples),
            "num_recouplings": sum(s.num_recouplings for s in samples),
            "responses_undrafted": sum(bool(s.drafts_off) for s in samples)}
