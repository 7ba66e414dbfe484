"""Rollouts with Hugging Face ``generate``: batched, KV-cached, left-padded, reproducible.

Sampling is done by our own logits processor rather than by ``generate``'s multinomial draw:
``generate`` runs in greedy mode over ``(logits / T, top-k, top-p filtered) + Gumbel noise``,
and the noise of each row comes from its own ``torch.Generator`` seeded from
``(sampling.seed, prompt index, sample index)``. The arg-max of Gumbel-perturbed logits is an
exact sample from the softmax, so this *is* temperature sampling, but each response is
reproducible whatever else shares its batch, and the same processor records the processed
(tempered, filtered) log-prob of each sampled token, vLLM's ``processed_logprobs`` mode.

The engine shares the policy module itself, so a weight "sync" only records the version.
Under FSDP2 every sharded module is unsharded for the duration of a ``generate`` call
(:func:`arlopti.learner.sharding.unsharded_for_generate`): entering and leaving are collective,
so every rank calls ``generate``, also with no prompts, and decoding itself runs no collective.
"""

from __future__ import annotations

import contextlib
import hashlib
import time

import torch
from torch import Tensor, nn

from arlopti.rollout.engine import Completion, RolloutEngine, SamplingConfig


def sample_seed(base: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed for one response, stable across Python processes."""
    digest = hashlib.blake2b(f"{base}/{prompt_index}/{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def filter_logits(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Temperature, then top-k, then nucleus (top-p) filtering; removed entries become -inf."""
    z = logits.float() / temperature
    if top_k is not None and 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = probs.cumsum(-1) - probs > top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


class _GumbelSampler:
    """A logits processor: filtered logits + per-row Gumbel noise; records sampled log-probs."""

    def __init__(self, seeds: list[int], sampling: SamplingConfig, device):
        self.sampling = sampling
        self.greedy = sampling.temperature == 0
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.logprobs: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        s = self.sampling
        if self.greedy:
            z = scores.float()
        else:
            z = filter_logits(scores, s.temperature, s.top_k, s.top_p)
        if not self.greedy:
            u = torch.stack([torch.rand(z.shape[-1], generator=g, device=z.device) for g in self.gens])
            u = u.clamp(1e-20, 1.0 - 1e-7)
            noisy = z - torch.log(-torch.log(u))  # + Gumbel(0, 1) noise
        else:
            noisy = z
        choice = noisy.argmax(-1)
        if s.logprobs:
            self.logprobs.append(torch.log_softmax(z, -1).gather(-1, choice[:, None]).squeeze(-1))
        # generate() takes the arg-max of what we return: make the choice unambiguous.
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, choice[:, None], 0.0)
        return out


def _fsdp_unsharded(module: nn.Module):
    """Unshard every FSDP2 module under ``module`` for generate(); a no-op for plain modules."""
    from arlopti.learner.sharding import unsharded_for_generate

    return unsharded_for_generate(module)


class HFEngine(RolloutEngine):
    """``generate`` on the live policy. ``policy`` is a ``PolicyLM`` (or any module with ``.hf``)."""

    def __init__(self, policy: nn.Module, tokenizer, generation_batch_size: int = 64,
                 autocast_dtype: torch.dtype | None = None):
        super().__init__()
        self.policy = policy
        self.tokenizer = tokenizer
        self.generation_batch_size = generation_batch_size
        self.autocast_dtype = autocast_dtype

    @property
    def hf(self) -> nn.Module:
        return getattr(self.policy, "hf", self.policy)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        if not prompt_ids:
            with _fsdp_unsharded(self.policy):  # collective under FSDP2: join the other ranks
                return []
        jobs = [(i, j) for i in range(len(prompt_ids)) for j in range(n)]
        # Similar prompt lengths in one call waste less padding; results are re-ordered below.
        jobs.sort(key=lambda ij: len(prompt_ids[ij[0]]))
        results: dict[tuple[int, int], Completion] = {}
        base = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**31, ()).item())
        was_training = self.hf.training
        self.hf.eval()
        t0 = time.perf_counter()
        try:
            with _fsdp_unsharded(self.policy):
                for lo in range(0, len(jobs), self.generation_batch_size):
                    chunk = jobs[lo:lo + self.generation_batch_size]
                    outs = self._generate_chunk([prompt_ids[i] for i, _ in chunk],
                                                [sample_seed(base, i, j) for i, j in chunk], sampling)
                    results.update(zip(chunk, outs))
        finally:
            self.hf.train(was_training)
        self.stats.extra["last_generate_s"] = time.perf_counter() - t0
        grouped = [[results[(i, j)] for j in range(n)] for i in range(len(prompt_ids))]
        self.stats.generated_tokens += sum(len(c.token_ids) for cs in grouped for c in cs)
        return grouped

    def _generate_chunk(self, prompts: list[list[int]], seeds: list[int], sampling: SamplingConfig) -> list[Completion]:
        from transformers import LogitsProcessorList

        tok = self.tokenizer
        device = next(self.hf.parameters()).device
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):  # left padding
            ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        sampler = _GumbelSampler(seeds, sampling, device)
        eos = self.hf.generation_config.eos_token_id
        if eos is None:
            eos = tok.eos_token_id
        kwargs = dict(
            input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens, do_sample=False,
            logits_processor=LogitsProcessorList([sampler]), pad_token_id=pad, eos_token_id=eos,
            use_cache=True, num_beams=1, temperature=None, top_p=None, top_k=None,
        )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        amp = (torch.autocast(device_type=device.type, dtype=self.autocast_dtype)
               if self.autocast_dtype is not None else contextlib.nullcontext())
        with amp:
            out = self.hf.generate(**kwargs)
        new = out[:, width:].tolist()
        lps = torch.stack(sampler.logprobs, 1).tolist() if sampling.logprobs and sampler.logprobs else None
        eos_set = set(eos if isinstance(eos, (list, tuple)) else [eos])
        comps = []
        for r, seq in enumerate(new):
            cut, reason = len(seq), "length"
            for t, token in enumerate(seq):
                if token in eos_set:
                    cut, reason = t + 1, "stop"  # keep EOS: the policy must learn to stop
                    break
            seq = seq[:cut]
            if reason == "length" and sampling.stop:
                # generate() pads rows it stopped on a stop string; drop that padding
                while seq and seq[-1] == pad and pad not in eos_set:
                    seq.pop()
                if len(seq) < sampling.max_new_tokens:
                    reason = "stop"
            text = tok.decode(seq, skip_special_tokens=True)
            comps.append(Completion(token_ids=seq, text=text, finish_reason=reason,
                                    logprobs=lps[r][:cut] if lps is not None else None))
        return comps
