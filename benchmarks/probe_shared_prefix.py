"""Feasibility probe for issue 50's shared-prefix update (not the learner's path yet).

GRPO samples G responses per prompt, and the learner forwards ``[prompt | response]`` for every row, so
each group's prompt goes through the decoder G times. The probe forwards each distinct prompt once
(``use_cache=True``), hands its keys and values to the group's rows (``DynamicCache.reorder_cache`` with the
row -> prompt index, a differentiable ``index_select``), forwards the responses on top, and back-propagates
a token-mean log-prob loss through both. It compares that with the learner's one-pass forward on the same
batch: the largest per-token log-prob difference (beside the rounding floor: the one-pass forward of the
whole batch against one group at a time), the parameter gradients' cosine (float64) and largest relative
difference, and the wall time of forward + backward, rounds interleaved (plain, shared, plain, ...).

Batch: ``n`` prompts of lengths P, P-3, ... (left-padded to P) with G responses each of lengths R, R-1, ...
(right-padded to R), random ids; the demo's shape is P=178, R=96, G=4, n=2.

    python benchmarks/probe_shared_prefix.py                 # the tiny model
    python benchmarks/probe_shared_prefix.py --smollm2 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from arlopti.learner.policy import position_ids_from_mask
from arlopti.ops.logprobs import token_logprobs
from arlopti.utils.machine import gemm_flops


def prompt_groups(ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first row of each distinct prompt [U], the prompt of each row [B])``; pad ids never matter."""
    key = ids[:, :prompt_len].masked_fill(mask[:, :prompt_len] == 0, -1)
    uniq, inv = torch.unique(key, dim=0, return_inverse=True)
    rows = ids.shape[0]
    first = torch.full((uniq.shape[0],), rows, dtype=torch.long).scatter_reduce(0, inv, torch.arange(rows), "amin")
    return first, inv


def shared_hidden(backbone, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The hidden states that predict the response tokens ``[B, R, H]``, each prompt forwarded once."""
    first, inv = prompt_groups(ids, mask, prompt_len)
    pos = position_ids_from_mask(mask)
    out = backbone(input_ids=ids[first, :prompt_len], attention_mask=mask[first, :prompt_len],
                   position_ids=pos[first, :prompt_len], use_cache=True)
    cache = out.past_key_values
    cache.reorder_cache(inv)  # each row gets its prompt's keys and values
    resp = backbone(input_ids=ids[:, prompt_len:], attention_mask=mask, position_ids=pos[:, prompt_len:],
                    past_key_values=cache, use_cache=True)
    return torch.cat([out.last_hidden_state[inv, prompt_len - 1:prompt_len], resp.last_hidden_state[:, :-1]], 1)


def plain_hidden(backbone, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
    out = backbone(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
    return out.last_hidden_state[:, prompt_len - 1:-1]


def grouped_batch(vocab: int, prompt_len: int, resp_len: int, group: int, prompts: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for j in range(prompts):
        plen = prompt_len - 3 * j
        prompt = torch.randint(3, vocab, (plen,), generator=g)
        for k in range(group):
            rlen = resp_len - k
            resp = torch.randint(3, vocab, (rlen,), generator=g)
            pad_l, pad_r = torch.zeros(prompt_len - plen, dtype=torch.long), torch.zeros(resp_len - rlen, dtype=torch.long)
            ids.append(torch.cat([pad_l, prompt, resp, pad_r]))
            masks.append(torch.cat([pad_l, torch.ones(plen + rlen, dtype=torch.long), pad_r]))
    return torch.stack(ids), torch.stack(masks)


def one_pass(model, hidden_fn, ids, mask, prompt_len):
    """Forward + backward of the token-mean log-prob: ``(log-probs [B, R], gradients, seconds)``."""
    model.zero_grad(set_to_none=True)
    head, resp_mask = model.get_output_embeddings(), mask[:, prompt_len:].float()
    t0 = time.perf_counter()
    hidden = hidden_fn(model.get_decoder(), ids, mask, prompt_len)
    b, r, h = hidden.shape
    logp = token_logprobs(hidden.reshape(b * r, h), head.weight, ids[:, prompt_len:].reshape(b * r),
                          temperature=1.0, impl="fused", with_entropy=False)[0].view(b, r)
    ((logp * resp_mask).sum() / resp_mask.sum()).backward()
    seconds = time.perf_counter() - t0
    grads = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
    return logp.detach() * resp_mask, grads, seconds


@torch.no_grad()
def rounding_floor(model, ids, mask, prompt_len: int, group: int) -> float:
    """The largest log-prob difference between the one-pass forward of the whole batch and of one group at a
    time: what fp32 rounding alone moves when only the GEMM shapes change (no sharing)."""
    whole = one_pass_logp(model, ids, mask, prompt_len)
    parts = torch.cat([one_pass_logp(model, ids[i:i + group], mask[i:i + group], prompt_len)
                       for i in range(0, ids.shape[0], group)])
    return float(((whole - parts) * mask[:, prompt_len:]).abs().max())


def one_pass_logp(model, ids, mask, prompt_len: int) -> torch.Tensor:
    hidden = plain_hidden(model.get_decoder(), ids, mask, prompt_len)
    b, r, h = hidden.shape
    head = model.get_output_embeddings()
    return token_logprobs(hidden.reshape(b * r, h), head.weight, ids[:, prompt_len:].reshape(b * r),
                          temperature=1.0, impl="fused", with_entropy=False)[0].view(b, r)


def compare(model, prompt_len: int, resp_len: int, group: int, prompts: int, rounds: int) -> dict:
    ids, mask = grouped_batch(model.config.vocab_size, prompt_len, resp_len, group, prompts)
    times = {"plain": [], "shared": []}
    for _ in range(rounds):
        lp0, g0, t0 = one_pass(model, plain_hidden, ids, mask, prompt_len)
        lp1, g1, t1 = one_pass(model, shared_hidden, ids, mask, prompt_len)
        times["plain"].append(t0)
        times["shared"].append(t1)
    return {"max_dlogp": float((lp0 - lp1).abs().max()),
            "rounding_floor_dlogp": rounding_floor(model, ids, mask, prompt_len, group),
            "grad_cos": float(torch.nn.functional.cosine_similarity(g0, g1, 0)),
            "grad_max_rel": float((g0 - g1).abs().max() / g0.abs().max()),
            "plain_s": statistics.median(times["plain"]), "shared_s": statistics.median(times["shared"]),
            "speedup": statistics.median(a / b for a, b in zip(times["plain"], times["shared"]))}


def main() -> None:
    from arlopti.models.loading import build_tiny_model, build_tiny_tokenizer, load_causal_lm, load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct at the demo's shape")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.smollm2:
        tok = load_tokenizer("smollm2-135m-instruct")
        model, shape = load_causal_lm("smollm2-135m-instruct", tok, "float32"), (178, 96, 4, 2)
    else:
        model, shape = build_tiny_model(build_tiny_tokenizer()), (20, 12, 4, 2)
    model.train()
    print(f"fp32 GEMM before: {gemm_flops() / 1e9:.0f} GFLOP/s")
    result = compare(model, *shape, rounds=args.rounds)
    print(f"fp32 GEMM after: {gemm_flops() / 1e9:.0f} GFLOP/s")
    result["one_minus_grad_cos"] = 1 - result.pop("grad_cos")
    print(f"P, R, G, prompts = {shape}: " + ", ".join(f"{k} {v:.3g}" for k, v in result.items()))


if __name__ == "__main__":
    main()
