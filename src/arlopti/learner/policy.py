"""A causal LM wrapped so that its forward returns per-token log-probs of the response.

``PolicyLM(hf_model)(input_ids, attention_mask, prompt_len, temperature)`` runs the decoder
backbone, then sends the hidden states of the response positions through
:func:`arlopti.ops.logprobs.token_logprobs` with the LM-head weight, so that the full
``[B, T, V]`` logits never have to exist (with ``logprob_impl="fused"``).

Layout of a batch (built by the rollout callback): ``input_ids = [prompt | response]`` with
prompts **left**-padded to a common length ``P`` and responses **right**-padded to ``R``. The
response token at position ``P + j`` is predicted from the hidden state at ``P + j − 1``.
Position ids follow the attention mask (``cumsum − 1``), exactly as HF ``generate`` numbers
them, so the training forward sees the same positions the sampler saw.

Why a wrapper and not ``hf_model(...)``: under FSDP2 the wrapper is the root module whose
forward unshards the embedding, final norm and LM head; calling the backbone and head piecewise
from outside a module's forward would see sharded parameters.

Full-distribution statistics (``stats``, a :class:`~arlopti.ops.tile_stats.StatsRequest`: Σ p², the
top-K log-probs, a min-p proxy) come out of the same fused pass as a third output, ``[B, R]`` each
(``[B, R, K]`` for the top K); :mod:`arlopti.plugins.forward_needs` says which a run needs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from arlopti.ops.logprobs import token_logprobs
from arlopti.ops.tile_stats import StatsRequest, TokenStats


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def _head_of(hf_model: nn.Module) -> nn.Linear:
    head = hf_model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise TypeError(f"{type(hf_model).__name__}: the LM head is {type(head).__name__}, not nn.Linear; "
                        "only plain linear heads are supported")
    cfg = getattr(hf_model, "config", None)
    for key in ("final_logit_softcapping", "logit_scale"):
        if getattr(cfg, key, None) not in (None, 1.0):
            raise NotImplementedError(f"model config sets {key}; arlopti's log-prob path does not apply it")
    return head


class PolicyLM(nn.Module):
    """``forward`` → ``(log_probs [B, R], entropy [B, R] | None)`` in fp32, and with ``stats`` a third
    output, the :class:`~arlopti.ops.tile_stats.TokenStats` of the response tokens."""

    def __init__(self, hf_model: nn.Module, logprob_impl: str = "naive"):
        super().__init__()
        self.hf = hf_model
        self.logprob_impl = logprob_impl
        _head_of(hf_model)

    @property
    def config(self):
        return self.hf.config

    def forward(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float = 1.0,
                with_entropy: bool = True, stats: StatsRequest | None = None):
        auto = getattr(self.hf, "arlopti_auto_checkpointing", None)  # model.lora.activation_checkpointing=null
        if auto is not None and self.training and torch.is_grad_enabled():
            auto.prepare(input_ids, _activation_element_size(self.hf, input_ids.device))
        backbone = self.hf.get_decoder()
        head = self.hf.get_output_embeddings()
        out = backbone(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        hidden = out.last_hidden_state[:, prompt_len - 1:-1]  # predicts tokens P .. L-1
        targets = input_ids[:, prompt_len:]
        b, r, h = hidden.shape
        logp, ent, *extra = token_logprobs(hidden.reshape(b * r, h), head.weight, targets.reshape(b * r),
                                           temperature=temperature, bias=head.bias, impl=self.logprob_impl,
                                           with_entropy=with_entropy, stats=stats)
        # clone: FSDP2 hooks must not see a view of an internal buffer as the module output
        out = logp.view(b, r).clone(), (ent.view(b, r).clone() if ent is not None else None)
        if stats is None:
            return out
        return (*out, extra[0].map(lambda t: t.view(b, r, *t.shape[1:]).clone()))


def _activation_element_size(hf_model: nn.Module, device: torch.device) -> int:
    """Bytes per activation element of a forward now: autocast's dtype when it is on, else the embedding's
    (under FSDP2's bf16 compute the root's parameters, the embedding among them, are unsharded in bf16 by
    the time this forward runs)."""
    if torch.is_autocast_enabled(device.type):
        return torch.finfo(torch.get_autocast_dtype(device.type)).bits // 8
    weight = hf_model.get_input_embeddings().weight
    return weight.element_size()


def disable_dropout(model: nn.Module) -> None:
    """RL log-prob ratios assume a deterministic forward: zero every dropout probability."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    cfg = getattr(model, "config", None)
    for key in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if cfg is not None and isinstance(getattr(cfg, key, None), float):
            setattr(cfg, key, 0.0)


@torch.no_grad()
def batched_logprobs(policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_len: int,
                     temperature: float, micro_batch_size: int, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """No-grad log-probs over a whole batch in chunks of ``micro_batch_size`` rows."""
    logps, ents = [], []
    for lo in range(0, input_ids.shape[0], micro_batch_size):
        lp, en = policy(input_ids[lo:lo + micro_batch_size], attention_mask[lo:lo + micro_batch_size],
                        prompt_len, temperature, with_entropy)
        logps.append(lp)
        if en is not None:
            ents.append(en)
    return torch.cat(logps), (torch.cat(ents) if ents else None)


@torch.no_grad()
def fill_logprobs(model: nn.Module, experience, rows: list[int], out: Tensor, chunk_rows: int, temperature: float,
                  stats: StatsRequest | None = None, stats_out: dict[str, Tensor] | None = None) -> None:
    """Fill ``out[rows]`` with ``model``'s log-probs of ``experience``'s responses (no grad).

    Rows go longest response first in chunks of ``chunk_rows``, each trimmed to its longest
    response (less padding than chunks in row order); positions past a row's chunk width keep
    ``out``'s values. Runs under the caller's precision context. The chunk count depends only on
    ``len(rows)``, equal on every rank (the forwards are collectives under FSDP2). With ``stats``,
    each requested per-token statistic (``[B, R]``: Σ p², the min-p fields) fills ``stats_out[name]``
    the same way.
    """
    if not rows:
        return
    lengths = experience.response_mask[rows].sum(-1).tolist()
    order = [rows[i] for i in sorted(range(len(rows)), key=lambda i: (-lengths[i], i))]
    for lo in range(0, len(order), chunk_rows):
        chunk = order[lo:lo + chunk_rows]
        sub = experience.select(chunk)
        logp, _, *extra = model(sub.input_ids, sub.attention_mask, sub.prompt_len, temperature, with_entropy=False,
                                stats=stats)
        idx = torch.tensor(chunk, device=out.device)
        out[idx, :logp.shape[1]] = logp.to(out.dtype)
        for name, value in (extra[0]._asdict().items() if extra else ()):
            if value is not None and value.dim() == 2:
                stats_out[name][idx, :value.shape[1]] = value.to(stats_out[name].dtype)


def old_and_ref_log_probs(policy: nn.Module, ref: nn.Module | None, experience, skip: set[int], chunk_rows: int,
                          temperature: float, lora_ref: bool = False, stats: StatsRequest | None = None):
    """``(logπ_old, reference log-probs)`` of ``experience``'s responses, no grad, at ``temperature``: the
    first of every row not in ``skip`` (zeros there), the second of all rows from ``ref``, or with
    ``lora_ref`` from ``policy`` with its LoRA adapters off, else None (β = 0). Zeros on padding.
    ``policy`` runs in eval mode and gets its mode back. With ``stats`` (the old policy's statistics
    the advantages read, :func:`arlopti.plugins.forward_needs.old_pass_stats`) a third element, their
    :class:`~arlopti.ops.tile_stats.TokenStats` ``[B, R]`` from the same pass (zeros on ``skip`` rows and
    padding)."""
    from arlopti.models.lora import adapters_disabled

    mask = experience.response_mask
    old = torch.zeros_like(mask)
    per_token = None if stats is None else {name: torch.zeros_like(mask) for name in _per_token_fields(stats)}
    was_training = policy.training
    policy.eval()
    rows = [i for i in range(len(experience)) if i not in skip]
    fill_logprobs(policy, experience, rows, old, chunk_rows, temperature, stats, per_token)
    ref_lp = None
    if ref is not None:
        ref_lp = torch.zeros_like(mask)
        fill_logprobs(ref, experience, list(range(len(experience))), ref_lp, chunk_rows, temperature)
    elif lora_ref:
        ref_lp = torch.zeros_like(mask)
        with adapters_disabled(policy):
            fill_logprobs(policy, experience, list(range(len(experience))), ref_lp, chunk_rows, temperature)
    policy.train(was_training)
    if stats is None:
        return old * mask, ref_lp
    kept = {k: torch.where(mask > 0, v, torch.zeros_like(v)) for k, v in per_token.items()}  # no -inf * 0
    return old * mask, ref_lp, TokenStats(**kept)


def _per_token_fields(stats: StatsRequest) -> list[str]:
    """The ``[B, R]`` statistics a request returns (the top-K ones are ``[B, R, K]`` and not kept here)."""
    if stats.top_k:
        raise ValueError("old_and_ref_log_probs keeps only per-token statistics; top-K is the training forward's")
    return (["sum_p2"] if stats.sum_p2 else []) + (["kept_log_mass", "min_p_log_prob"]
                                                  if stats.min_p_log is not None else [])
