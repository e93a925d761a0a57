"""Train the embedded default model: a ~0.9M-parameter Llama on the addchain task, on a CPU.

    bubblespec train-tiny --out bubblespec/assets/tiny-llama

Supervised training from scratch (seeded) on responses with injected slips (see
:mod:`bubblespec.tasks.addchain`), then a short evaluation that samples prompts x samples at
temperature 1.0 and reports what a rollout service cares about: mean reward, the response
length tail (p99/median) and how alike sibling responses are. Writes a Hugging Face model
directory (config, float32 safetensors, tokenizer, generation config) that vLLM and
transformers load offline, plus ``training_report.json``.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bubblespec.tasks.addchain import MAX_NEW_TOKENS, AddChainTask, Slips, hf_tokenizer_files
from bubblespec.tasks.stats import format_report, rollout_report

IGNORE = -100


def build_model(vocab_size: int, hidden: int = 128, layers: int = 4, heads: int = 4,
                intermediate: int = 384, max_positions: int = 1024):
    """A freshly initialised ``LlamaForCausalLM`` with the task's special token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from bubblespec.tasks.addchain import BOS_ID, EOS_ID, PAD_ID

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, torch_dtype="float32",
    )
    return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")


def make_batches(task: AddChainTask, total_tokens: int, batch_tokens: int, seed: int,
                 uniform_fraction: float, slips: Slips) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Length-bucketed (input_ids, labels) batches holding ~``total_tokens`` tokens.

    A ``uniform_fraction`` of the examples draws ``k`` uniformly so that long responses (and
    high countdown numbers) are seen often enough; the rest follow the prompt distribution.
    Labels cover only response tokens (prompt and padding are ignored).
    """
    rng = random.Random(f"addchain-train-{seed}")
    examples: list[tuple[list[int], int]] = []
    n_tok = 0
    while n_tok < total_tokens:
        ex = task.training_example(rng, slips, uniform_count=rng.random() < uniform_fraction)
        examples.append(ex)
        n_tok += len(ex[0])
    examples.sort(key=lambda e: len(e[0]))
    batches, cur = [], []
    for ex in examples:
        if cur and (len(cur) + 1) * len(ex[0]) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(ex)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    out = []
    for group in batches:
        width = max(len(ids) for ids, _ in group)
        inp = torch.full((len(group), width), task.pad_id, dtype=torch.long)
        lab = torch.full((len(group), width), IGNORE, dtype=torch.long)
        for row, (ids, plen) in enumerate(group):
            inp[row, : len(ids)] = torch.tensor(ids)
            lab[row, plen: len(ids)] = torch.tensor(ids[plen:])
        out.append((inp, lab))
    return out


def train(model, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
          warmup: int = 50, log_every: int = 50) -> list[float]:
    """AdamW with linear warm-up and cosine decay to lr/10; returns the per-step losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    total = len(batches)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(total - warmup, 1)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    losses: list[float] = []
    t0 = time.time()
    for step, (inp, lab) in enumerate(batches):
        loss = model(input_ids=inp, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == total:
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(f"step {step + 1}/{total} loss {recent:.4f} lr {sched.get_last_lr()[0]:.2e} "
                  f"{time.time() - t0:.0f}s", flush=True)
    return losses


@torch.no_grad()
def sample(model, task: AddChainTask, prompts, n: int, temperature: float = 1.0,
           max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0,
           chunk: int = 128) -> list[list[list[int]]]:
    """``n`` responses per prompt from ``model`` (transformers generate), cut after ``<eos>``."""
    model.eval()
    torch.manual_seed(seed)
    flat = [p for p in prompts for _ in range(n)]
    outs: list[list[int]] = []
    for i in range(0, len(flat), chunk):
        part = flat[i: i + chunk]
        width = len(part[0].input_ids)
        assert all(len(p.input_ids) == width for p in part), "prompts differ in length"
        inp = torch.tensor([list(p.input_ids) for p in part])
        gen = model.generate(
            input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=True,
            temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
            eos_token_id=task.eos_id, pad_token_id=task.pad_id,
        )
        for row in gen[:, width:].tolist():
            outs.append(row[: row.index(task.eos_id) + 1] if task.eos_id in row else row)
    return [outs[i * n: (i + 1) * n] for i in range(len(prompts))]


def save(model, out: Path, report: dict) -> int:
    """Write the HF model directory; returns its size in bytes."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id, do_sample=True, temperature=1.0,
        max_new_tokens=MAX_NEW_TOKENS,
    )
    model.save_pretrained(out, safe_serialization=True)
    # Older transformers (4.x, used with the GPU vllm package) read these legacy keys.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", cfg.get("dtype", "float32"))
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "model.safetensors").chmod(0o644)
    for name, text in hf_tokenizer_files().items():
        (out / name).write_text(text + "\n")
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file())


@dataclass(frozen=True)
class TinyTrainConfig:
    """What `bubblespec train-tiny` runs (its flags; defaults and help in its `--help`)."""

    out: Path
    seed: int
    tokens: int
    """Training tokens (padded)."""
    batch_tokens: int
    """Padded tokens per optimizer step (small batches learn faster here)."""
    lr: float
    uniform_fraction: float
    slip_value: float
    slip_skip: float
    slip_repeat: float
    threads: int
    """Torch threads (1 is robust on a shared 2-core machine)."""
    eval_prompts: int
    eval_samples: int


def run(args: TinyTrainConfig) -> dict:
    """Train, evaluate, save; returns the report."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    task = AddChainTask()
    slips = Slips(args.slip_value, args.slip_skip, args.slip_repeat)
    batches = make_batches(task, args.tokens, args.batch_tokens, args.seed,
                           args.uniform_fraction, slips)
    model = build_model(task.vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters; {len(batches)} batches, "
          f"{sum(b[0].numel() for b in batches):,} padded tokens", flush=True)

    t0 = time.time()
    losses = train(model, batches, args.lr)
    train_s = time.time() - t0
    final_loss = sum(losses[-50:]) / len(losses[-50:])
    print(f"trained in {train_s:.0f}s; final loss (mean of last 50 steps) {final_loss:.4f}")

    t1 = time.time()
    prompts = task.make_prompts(args.eval_prompts, seed=10_000 + args.seed)
    responses = sample(model, task, prompts, args.eval_samples, seed=args.seed)
    rep = rollout_report(prompts, responses, task.reward)
    print(f"evaluation at temperature 1.0 ({time.time() - t1:.0f}s):\n{format_report(rep)}")

    report = {
        "task": task.name, "seed": args.seed, "parameters": n_params, "steps": len(losses),
        "train_seconds": round(train_s, 1), "final_loss": round(final_loss, 4),
        "slips": vars(slips), "args": {k: str(v) for k, v in asdict(args).items()},
        "eval_transformers_t1": rep,
    }
    size = save(model, args.out, report)
    print(f"wrote {args.out} ({size / 1e6:.2f} MB)")
    return report
