"""One decoding step of a Llama-family decoder (Llama, Qwen2) over a preallocated KV cache.

The HF engine's loop (:func:`arlopti.rollout.hf.decode`) spends most of a small model's decoding
step outside the matmuls: transformers re-derives the 4-D attention mask, grows its
``DynamicCache`` by concatenation (a copy of every layer's keys and values, each token),
repeats the grouped key/value heads for SDPA (another copy) and goes through its decorators
and output classes on every call. :class:`KVDecoder` runs the same modules' arithmetic
without that:

* the prefill is the model's own forward (``DynamicCache``); its keys and values are then
  copied once into one buffer per layer, ``[B, kv_heads, capacity, head_dim]``, and every
  decoding step writes its token's keys and values in place;
* attention reads the filled prefix of that buffer, ``[:, :, :t]`` (never the whole capacity:
  a static cache read whole makes attention cost grow with ``max_new_tokens``), with SDPA's
  grouped-query mode instead of repeated heads, and one boolean padding mask per step
  (``None`` when no row is padded, as transformers passes it);
* the rotary angles are computed once per step, by the model's own ``rotary_emb``;
* the norms, projections and MLPs are the model's own modules, called directly (so LoRA
  adapters and autocast apply as in the model's forward); or, given ``packed``
  (:class:`~arlopti.rollout.packed_linear.PackedLinears`, the engine's default on CPU), the
  plain fp32 projections run on oneDNN-packed copies of their weights (q, k and v as one
  product, gate and up as one, then o, down and the LM head), and the MLP is its own
  arithmetic, ``down(act(gate(x)) * up(x))``, as Llama's and Qwen2's ``forward`` write it.

Same arithmetic: each op is the op transformers runs (``apply_rotary_pos_emb`` is taken from
the model's own module), on the same values, so without ``packed`` the logits equal the model's
forward bit for bit; ``tests/rollout/test_hf_kv_decode.py`` checks it against ``generate`` and
the plain loop. Packed, the products are the same but summed in another order (float32
rounding: :mod:`arlopti.rollout.packed_linear`).
:func:`unsupported_reason` lists what falls back to the model's forward (other architectures,
attention other than SDPA, sliding windows, FSDP2-sharded modules).
"""

from __future__ import annotations

import sys

import torch.nn.functional as F
from torch import Tensor, nn

from arlopti.rollout.packed_linear import PackedLinears

#: The HF classes whose decoder layers :class:`KVDecoder` runs (same layer structure).
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def base_model(model: nn.Module) -> nn.Module:
    """The HF ``*ForCausalLM`` under a peft wrapper (or ``model`` itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`KVDecoder` cannot run ``model`` (None: it can)."""
    inner = base_model(model)
    name = type(inner).__name__
    if name not in SUPPORTED:
        return f"{name} is not one of {', '.join(SUPPORTED)}"
    cfg = inner.config
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {cfg._attn_implementation!r} (the step runs SDPA's arithmetic)"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())):
        return "sliding-window layers"
    if any(type(m).__name__.startswith("FSDP") for m in inner.modules()):
        return "FSDP2-sharded modules (their hooks run in the model's forward)"
    return None


class KVDecoder:
    """Prefill once, then decode one token per :meth:`step`, for ``batch`` left-padded rows.

    ``capacity``: the longest sequence (prompt width + new tokens) the buffers hold; ``packed``:
    the packed projections to run (module docstring; refreshed by the caller, :func:`projection_groups`).
    """

    def __init__(self, model: nn.Module, capacity: int, packed: PackedLinears | None = None):
        self.model = model
        self.packed = packed
        self.inner = base_model(model)
        self.body = self.inner.model
        self.layers = list(self.body.layers[: self.inner.config.num_hidden_layers])
        self.capacity = capacity
        # transformers' own rotary application for this architecture (same arithmetic, by construction)
        self.rope = sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.length = 0

    def _proj(self, modules: tuple[nn.Module, ...], x: Tensor) -> tuple[Tensor, ...]:
        return self.packed(modules, x) if self.packed is not None else tuple(m(x) for m in modules)

    def _mlp(self, mlp: nn.Module, x: Tensor) -> Tensor:
        if self.packed is None or not _gated_mlp(mlp):
            return mlp(x)
        gate, up = self._proj((mlp.gate_proj, mlp.up_proj), x)
        return self._proj((mlp.down_proj,), mlp.act_fn(gate) * up)[0]

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        """The model's forward over the prompts; returns the last position's logits ``[B, 1, V]``."""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        width = ids.shape[1]
        for layer in out.past_key_values.layers[: len(self.layers)]:
            k, v = layer.keys, layer.values
            shape = (k.shape[0], k.shape[1], self.capacity, k.shape[3])
            self.keys.append(k.new_empty(shape))
            self.values.append(v.new_empty(shape))
            self.keys[-1][:, :, :width].copy_(k)
            self.values[-1][:, :, :width].copy_(v)
        self.length = width
        return out.logits

    def step(self, tokens: Tensor, pos: Tensor, mask: Tensor) -> Tensor:
        """Logits ``[B, 1, V]`` of the next token after ``tokens [B, 1]`` at positions ``pos [B, 1]``.

        ``mask [B, t]``: the padding mask of the whole sequence, this token included.
        """
        t = self.length
        if t >= self.capacity:
            raise RuntimeError(f"KVDecoder: the cache holds {self.capacity} positions, all filled")
        hidden = self.body.embed_tokens(tokens)
        cos, sin = self.body.rotary_emb(hidden, position_ids=pos)
        attn_mask = None if bool(mask.all()) else mask.bool()[:, None, None, :]
        for i, layer in enumerate(self.layers):
            residual = hidden
            hidden = residual + self._attention(i, layer.self_attn, layer.input_layernorm(hidden), cos, sin,
                                                attn_mask)
            residual = hidden
            hidden = residual + self._mlp(layer.mlp, layer.post_attention_layernorm(hidden))
        self.length = t + 1
        return self._proj((self.inner.lm_head,), self.body.norm(hidden))[0]

    def _attention(self, i: int, attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor,
                   attn_mask: Tensor | None) -> Tensor:
        batch, hd, t = x.shape[0], attn.head_dim, self.length
        q, k, v = (y.view(batch, 1, -1, hd).transpose(1, 2)
                   for y in self._proj((attn.q_proj, attn.k_proj, attn.v_proj), x))
        q, k = self.rope(q, k, cos, sin)
        self.keys[i][:, :, t:t + 1].copy_(k)
        self.values[i][:, :, t:t + 1].copy_(v)
        out = F.scaled_dot_product_attention(q, self.keys[i][:, :, :t + 1], self.values[i][:, :, :t + 1],
                                             attn_mask=attn_mask, scale=attn.scaling,
                                             enable_gqa=attn.num_key_value_groups > 1)
        return self._proj((attn.o_proj,), out.transpose(1, 2).reshape(batch, 1, -1))[0]


def projection_groups(model: nn.Module) -> list[tuple[nn.Module, ...]]:
    """The projections a :class:`KVDecoder` step of ``model`` multiplies by, grouped as one packed
    product each (module docstring)."""
    inner = base_model(model)
    out: list[tuple[nn.Module, ...]] = []
    for layer in inner.model.layers[: inner.config.num_hidden_layers]:
        attn, mlp = layer.self_attn, layer.mlp
        out += [(attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,)]
        if _gated_mlp(mlp):
            out += [(mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)]
    return out + [(inner.lm_head,)]


def _gated_mlp(mlp: nn.Module) -> bool:
    """Llama's / Qwen2's MLP, ``down(act(gate(x)) * up(x))``, whose arithmetic the packed step restates."""
    return type(mlp).__name__ in ("LlamaMLP", "Qwen2MLP") and all(
        hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))


__all__ = ["KVDecoder", "SUPPORTED", "projection_groups", "unsupported_reason"]
