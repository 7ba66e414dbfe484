"""SFT cold start: a short supervised warm-up on generated K&K solution traces, before GRPO.

Why: a small instruct model (SmolLM2-135M) almost never emits the K&K answer format, so every
response scores −3, every group has zero reward spread, and GRPO gets no signal. A few dozen
SFT steps on our generator's puzzles teach the tags. The cold start is meant to be *short*:
it should leave the format rate and the accuracy well below saturation, so that the rise seen
during the GRPO steps is the RL's doing (the run summary reports the first GRPO step against
the last).

Objective (one step): the token-mean negative log-likelihood of the target response,

    L = − Σ_{b,t} m_{b,t} · log π(y_{b,t} | prompt_b, y_{b,<t}) / Σ_{b,t} m_{b,t}

over a batch of ``batch_size`` (prompt, ``sft_response``) pairs, at temperature 1, with the
response mask ``m`` covering the response tokens and the final EOS. AdamW, constant lr.

The puzzles are drawn with their own seed (``seed``), disjoint in practice from the training
set's. After the warm-up the reference model is reset to the warmed-up policy (the KL term then
anchors GRPO to the SFT model, the usual RLHF set-up), and the weight version is bumped so the
rollout engine syncs (:class:`arlopti.callbacks.cold_start.ColdStartCallback` runs it in training;
the analysis tools call :func:`run_cold_start` directly).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field

import torch

from arlopti.learner.experience import pad_prompt_response

log = logging.getLogger(__name__)


@dataclass
class ColdStartConfig:
    enabled: bool = True
    steps: int = 30
    batch_size: int = 8
    lr: float = 5e-5
    weight_decay: float = 0.0
    num_people: list[int] = field(default_factory=lambda: [2, 3])
    puzzles: int = 400
    style: str = "compact"  # the sft_response style: compact | full
    template: str = "qwen-instruct"
    seed: int = 987_654
    max_response_tokens: int = 256
    grad_clip: float = 1.0


def sft_examples(tokenizer, cfg: ColdStartConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) pairs from generated puzzles (see module docstring)."""
    from arlopti.prompts.records import render_prompt
    from arlopti.tasks.kk import build_prompt, sample_puzzles, sft_response

    per_n = max(1, cfg.puzzles // len(cfg.num_people))
    out = []
    for n in cfg.num_people:
        for i, p in enumerate(sample_puzzles(n, per_n, seed=cfg.seed + n)):
            rec = build_prompt(p, cfg.template).to_prompt_record(uid=f"sft/{n}/{i}", ground_truth=None)
            prompt = tokenizer(render_prompt(rec, tokenizer), add_special_tokens=False)["input_ids"]
            resp = tokenizer(sft_response(p, style=cfg.style), add_special_tokens=False)["input_ids"]
            resp = resp[: cfg.max_response_tokens - 1] + [tokenizer.eos_token_id]
            out.append((prompt, resp))
    return out


def sft_loss(policy, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Token-mean NLL of the responses given the prompts (module docstring)."""
    device = next(policy.parameters()).device
    ids, attn, mask, p = pad_prompt_response([b[0] for b in batch], [b[1] for b in batch], pad_id)
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    logp, _ = policy(ids, attn, p, 1.0, with_entropy=False)
    return -(logp * mask).sum() / mask.sum().clamp(min=1)


def run_cold_start(policy, tokenizer, cfg: ColdStartConfig, log_fn=None) -> list[float]:
    """Run ``cfg.steps`` SFT steps on ``policy`` in place; returns the per-step losses."""
    examples = sft_examples(tokenizer, cfg)
    rng = random.Random(cfg.seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = []
    policy.train()
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        batch = rng.sample(examples, min(cfg.batch_size, len(examples)))
        opt.zero_grad(set_to_none=True)
        loss = sft_loss(policy, batch, pad)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if log_fn is not None:
            log_fn({"cold_start/loss": losses[-1]}, step)
    log.info("cold start: %d SFT steps in %.1fs, loss %.3f -> %.3f", cfg.steps, time.perf_counter() - t0,
             losses[0] if losses else float("nan"), losses[-1] if losses else float("nan"))
    return losses
