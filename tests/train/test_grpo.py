"""The GRPO trainer (`train/grpo.py`) on the embedded tiny model: the two loss aggregations
against the loss written out by hand at ratio 1, and the policy's entropy at the sampled
positions against a direct computation."""

from __future__ import annotations

import math

import pytest
import torch

from bubblespec.train.grpo import Rollout, Trainer


@pytest.fixture(scope="module")
def model_dir() -> str:
    from bubblespec.tasks import default_model_dir

    try:
        return str(default_model_dir())
    except FileNotFoundError as e:
        pytest.skip(str(e))


def on_policy(trainer: Trainer, prompt: list[int], outs: list[list[int]],
              rewards: list[float], flips: list[int | None] | None = None) -> Rollout:
    """A group whose rollout log-probs are the trainer's own (the ratio is 1 everywhere)."""
    lps, _ = trainer._token_logprobs([prompt + o for o in outs], [len(prompt)] * len(outs))
    return Rollout(prompt, outs, [lp.tolist() for lp in lps], rewards, flips or [])


@pytest.mark.parametrize("micro_batch", [1, 8])
@pytest.mark.parametrize("agg", ["seq-mean", "token-mean"])
def test_loss_aggregation_at_ratio_one(model_dir: str, agg: str, micro_batch: int) -> None:
    """The same loss whether the gradient is accumulated sample by sample or in one chunk."""
    trainer = Trainer(model_dir, lr=0.0, loss_agg=agg)
    # advantages +1 / -1 (two samples, rewards 1 and 0); lengths 2 and 6
    group = on_policy(trainer, [1, 5, 9], [[4, 4], [6, 6, 6, 6, 6, 6]], [1.0, 0.0])
    stats = trainer.step([group], micro_batch=micro_batch)
    assert stats["samples"] == 2.0
    # per token -adv: seq-mean = -(1 - 1) / 2 = 0; token-mean = -(2 - 6) / 8 = 0.5
    want = 0.0 if agg == "seq-mean" else 0.5
    assert stats["loss"] == pytest.approx(want, abs=1e-5)
    assert stats["max_abs_logprob_gap"] < 1e-5


def test_unknown_aggregation_is_refused(model_dir: str) -> None:
    with pytest.raises(ValueError, match="loss_agg"):
        Trainer(model_dir, loss_agg="sum")


def test_entropy_at_the_sampled_positions_and_at_the_flips(model_dir: str) -> None:
    trainer = Trainer(model_dir, lr=0.0)
    prompt, outs = [1, 5, 9], [[4, 7, 3, 8], [6, 2]]
    group = on_policy(trainer, prompt, outs, [1.0, 0.0], flips=[2, None])
    stats = trainer.step([group])
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([prompt + outs[0]])).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1: -1]
    direct = (-(logp.exp() * logp).sum(-1)).tolist()
    e = stats["entropy"]
    assert e["tokens"] == 6 and e["flips"] == 1
    assert e["at_flips"] == pytest.approx(direct[2], rel=1e-4)
    vocab = trainer.model.config.vocab_size
    assert 0.0 < e["mean"] <= math.log(vocab) + 1e-6


def test_saved_weights_are_a_model_directory_of_their_own(model_dir: str, tmp_path) -> None:
    """The saved policy carries its base's tokenizer files, so it loads (and `bench policy`
    evaluates it) without the base model beside it."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bubblespec.train.files import TOKENIZER_FILES

    out = Trainer(model_dir, lr=0.0).save(str(tmp_path / "v1"))
    have = [n for n in TOKENIZER_FILES if (Path(model_dir) / n).is_file()]
    assert have and all((Path(out) / n).is_file() for n in have)
    AutoTokenizer.from_pretrained(out)
    AutoModelForCausalLM.from_pretrained(out)


def test_log_probs_and_entropy_equal_the_full_models_in_a_padded_batch(model_dir: str) -> None:
    """The head runs on response positions only; a batch of unequal lengths (padding) gives
    what the whole model's logits give, row by row."""
    trainer = Trainer(model_dir, lr=0.0)
    seqs, starts = [[1, 5, 9, 4, 7, 3, 8, 2], [1, 6, 2, 6], [3, 3, 3, 3, 3, 9]], [3, 2, 5]
    lps, ents = trainer._token_logprobs(seqs, starts)
    with torch.no_grad():
        for s, a, lp, ent in zip(seqs, starts, lps, ents):
            logp = torch.log_softmax(trainer.model(input_ids=torch.tensor([s])).logits[0], -1)
            rows = logp[a - 1 : len(s) - 1]
            want = rows.gather(1, torch.tensor(s[a:]).unsqueeze(-1)).squeeze(-1)
            assert lp.shape == want.shape
            assert torch.allclose(lp.detach(), want, atol=1e-5)
            assert ent == pytest.approx((-(rows.exp() * rows).sum(-1)).tolist(), rel=1e-4)


def _params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_a_trainer_resumed_from_its_checkpoint_takes_the_same_next_step(
        model_dir: str, tmp_path) -> None:
    """Two updates in one trainer, and one update, a checkpoint (`save` + `save_state`),
    then a fresh trainer that loads it and takes the second: bit-identical weights. The
    control, a fresh trainer that loads the weights alone (Adam's moments start from zero),
    lands elsewhere, so the test sees the optimiser state."""
    prompt, outs, rewards = [1, 5, 9], [[4, 7, 2, 8], [3, 3], [6, 2, 9]], [1.0, 0.0, 0.5]

    def update(t: Trainer) -> None:
        t.step([on_policy(t, prompt, outs, rewards)])

    whole = Trainer(model_dir, lr=1e-3, seed=3)
    update(whole)
    ckpt = str(tmp_path / "v1")
    whole.save(ckpt)
    whole.save_state(ckpt)
    update(whole)
    resumed = Trainer(model_dir, lr=1e-3, seed=3)
    resumed.load_state(ckpt)
    update(resumed)
    assert all(torch.equal(a, b) for a, b in zip(_params(whole), _params(resumed)))
    weights_only = Trainer(model_dir, lr=1e-3, seed=3)
    with torch.no_grad():
        for p, q in zip(weights_only.model.parameters(), Trainer(ckpt, lr=0.0).model.parameters()):
            p.copy_(q)
    update(weights_only)
    assert not all(torch.equal(a, b) for a, b in zip(_params(whole), _params(weights_only)))
    with pytest.raises(FileNotFoundError, match="no trainer state"):
        resumed.load_state(str(tmp_path))
