"""Rollouts on the live policy's Hugging Face model: batched, KV-cached, left-padded, reproducible.

Decoding is our own loop over the model's forward (:func:`decode`), or transformers' ``generate``
(``rollout.hf_decoder=generate``, and always for stop strings); both give the same tokens.
Sampling is done by our own sampler rather than by ``generate``'s multinomial draw: the arg-max
of ``(logits / T, top-k, top-p filtered) + Gumbel noise`` (under ``generate``, as a logits
processor that leaves ``generate`` in greedy mode).
The noise is counter-based: the uniform behind the Gumbel draw of row ``r``, decoding step
``t`` and vocabulary entry ``v`` is a hash of ``(seed_r, t, v)`` (:func:`gumbel_noise`), where
``seed_r`` comes from ``(sampling.seed, prompt index, sample index)``. One vectorised integer
op chain per decoding step serves the whole batch, and each response stays reproducible
whatever else shares its batch, however the jobs are chunked and however its prompt is padded.
The arg-max of Gumbel-perturbed logits is an exact sample from the softmax (the Gumbel-max
trick), so this *is* temperature sampling; the sampler also records the processed
(tempered, filtered) log-prob of each sampled token, vLLM's ``processed_logprobs`` mode.

The engine shares the policy module itself, so a weight "sync" only records the version and, on
the CPU in fp32, re-packs the decoding step's weights that the update changed for oneDNN's kernel
(``rollout.hf_packed``, :mod:`arlopti.rollout.packed_linear`; its seconds are the sync's).
Under FSDP2 every sharded module is unsharded for the duration of a ``generate`` call
(:func:`arlopti.utils.fsdp_unshard.unsharded_for_generate`): entering and leaving are collective,
so every rank calls ``generate``, also with no prompts, and decoding itself runs no collective.
"""

from __future__ import annotations

import contextlib
import inspect
import time

import torch
from torch import Tensor, nn

from arlopti.rollout.engine import Completion, RolloutEngine, SamplingConfig
from arlopti.rollout.kv_decode import KVDecoder, projection_groups, unsupported_reason
from arlopti.rollout.packed_linear import PackedLinears
from arlopti.rollout.seeds import sample_seed
from arlopti.utils.fsdp_unshard import unsharded_for_generate


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


# --------------------------------------------------------------------- counter-based noise
# Per (row, step): splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
# generators", OOPSLA 2014; its output mixer is Stafford's "variant 13", 2011). Per vocabulary
# entry: MurmurHash3's 32-bit finaliser ``fmix32`` (Appleby, MurmurHash3.cpp) on a Weyl sequence.
# The per-entry work is on int32 because it runs on B × V elements every decoding step: AVX2 has
# a native 32-bit multiply but not a 64-bit one, and int32 halves the memory traffic (measured:
# ``benchmarks/bench_hf_sampling.py --noise-only``). Constants are stored as signed ints: torch has
# no unsigned arithmetic on CPU, and its int32/int64 multiplication and addition wrap.
_MASK64 = (1 << 64) - 1
_GAMMA64 = 0x9E3779B97F4A7C15
_MIX64_1 = 0xBF58476D1CE4E5B9
_MIX64_2 = 0x94D049BB133111EB
_GAMMA32 = 0x9E3779B9
_FMIX32_1 = 0x85EBCA6B
_FMIX32_2 = 0xC2B2AE35
_UNIFORM_BITS = 23  # fp32 holds (m + 0.5) for m < 2**23 exactly, so u lies strictly in (0, 1)


def _signed(x: int, bits: int) -> int:
    """The signed ``bits``-bit int with the same bits as ``x mod 2**bits``."""
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def _xorshift_right(x: Tensor, k: int, bits: int) -> Tensor:
    """``x ^= x >>> k`` (logical shift) in place on int``bits``; torch's ``>>`` is arithmetic, so mask."""
    return x.bitwise_xor_(torch.bitwise_right_shift(x, k).bitwise_and_((1 << (bits - k)) - 1))


def mix64(x: Tensor) -> Tensor:
    """splitmix64's finaliser on an int64 tensor, in place:
    ``x ^= x>>>30; x *= 0xBF58476D1CE4E5B9; x ^= x>>>27; x *= 0x94D049BB133111EB; x ^= x>>>31``
    (modulo 2**64), a bijection whose every output bit depends on every input bit."""
    _xorshift_right(x, 30, 64).mul_(_signed(_MIX64_1, 64))
    _xorshift_right(x, 27, 64).mul_(_signed(_MIX64_2, 64))
    return _xorshift_right(x, 31, 64)


def row_step_keys(seeds: Tensor, step: int) -> Tensor:
    """Per-row int32 key of decoding step ``step``: the low 32 bits of ``mix64(seed + (step + 1)·γ)``,
    γ = splitmix64's gamma (the ``step``-th output of a splitmix64 stream seeded with the row's
    seed). ``seeds``: int64 ``[B]`` → int32 ``[B]``."""
    k = mix64(seeds + _signed((step + 1) * _GAMMA64, 64)).bitwise_and_(0xFFFFFFFF)
    return torch.where(k >= 1 << 31, k - (1 << 32), k).to(torch.int32)


def gumbel_noise(keys: Tensor, vocab_offsets: Tensor) -> Tensor:
    """Gumbel(0, 1) noise ``[B, V]``, fp32, for int32 row keys ``keys [B]`` (:func:`row_step_keys`).

    ``vocab_offsets = arange(V)·0x9E3779B9`` (int32, wrapping). For entry ``(r, v)``:
    ``x = fmix32(key_r + v·0x9E3779B9)`` with ``fmix32(x) = x ^= x>>>16; x *= 0x85EBCA6B;
    x ^= x>>>13; x *= 0xC2B2AE35; x ^= x>>>16`` (modulo 2**32; a bijection, so the V entries of a
    row never share a value); the top 23 bits ``m`` give ``u = (m + 1/2) / 2**23`` in ``(0, 1)``
    (never 0 or 1: no clamp needed), and the noise is ``−log(−log u)``. The resolution of ``u``
    matches ``torch.rand``'s fp32; the Gumbel tail is cut at ``−log(−log(1 − 2**-24)) ≈ 16.6``,
    as a float32 uniform cuts it. The value for ``(r, t, v)`` never depends on other rows, the
    batch, or how many draws came before: that makes a response reproducible on its own.
    """
    return _gumbel_of(keys.unsqueeze(1) + vocab_offsets.unsqueeze(0))


def _gumbel_of(x: Tensor) -> Tensor:
    """``−log(−log u)`` of :func:`gumbel_noise` for the int32 counters ``x = key + v·0x9E3779B9``
    (any shape; ``x`` is overwritten)."""
    _xorshift_right(x, 16, 32).mul_(_signed(_FMIX32_1, 32))
    _xorshift_right(x, 13, 32).mul_(_signed(_FMIX32_2, 32))
    _xorshift_right(x, 16, 32)
    m = torch.bitwise_right_shift(x, 32 - _UNIFORM_BITS).bitwise_and_((1 << _UNIFORM_BITS) - 1)
    u = m.to(torch.float32).add_(0.5).mul_(2.0 ** -_UNIFORM_BITS)
    return u.log_().neg_().log_().neg_()


#: Every value of :func:`gumbel_noise` lies in ``[−log(−log 2⁻²⁴), −log(−log(1 − 2⁻²⁴))] ≈
#: [−2.81, 16.64]``, a span of 19.45; with a margin for the fp32 rounding of ``z + g``:
_GUMBEL_SPAN = 20.0


def gumbel_argmax(z: Tensor, keys: Tensor, vocab_offsets: Tensor) -> Tensor:
    """``(gumbel_noise(keys, vocab_offsets) + z).argmax(-1)``, hashing only the entries that can win.

    An entry more than :data:`_GUMBEL_SPAN` below its row's largest ``z`` cannot win: its noise is at
    most 16.64 and the row's arg-max entry's at least −2.81. So the noise is hashed only at the
    entries within the span (``nonzero``, row-major), with the same counters, so the same values;
    each row's winner is the first (lowest-index) candidate holding the row's largest ``z + g``, as
    ``argmax`` picks. Exactly the dense result (tested); faster where a row's logits are peaked, as
    a language model's are. A row whose largest ``z`` is not finite (NaN), or a batch where more than
    a quarter of the entries are candidates, takes the dense path.
    """
    batch, vocab = z.shape
    top = z.max(-1, keepdim=True).values
    if bool(torch.isfinite(top).all()):
        rows, cols = (z >= top - _GUMBEL_SPAN).nonzero(as_tuple=True)
        if rows.numel() <= batch * vocab // 4:
            vals = z[rows, cols] + _gumbel_of(keys[rows] + vocab_offsets[cols])
            best = vals.new_full((batch,), float("-inf")).scatter_reduce_(0, rows, vals, "amax")
            hit = vals == best[rows]
            return cols.new_full((batch,), vocab).scatter_reduce_(0, rows[hit], cols[hit], "amin")
    return (gumbel_noise(keys, vocab_offsets) + z).argmax(-1)


def vocab_offsets(vocab: int, device) -> Tensor:
    """``arange(vocab)·0x9E3779B9`` as wrapping int32 (the per-column counter of :func:`gumbel_noise`)."""
    return torch.arange(vocab, dtype=torch.int32, device=device).mul_(_signed(_GAMMA32, 32))


class _GumbelSampler:
    """A logits processor: filtered logits + per-row hashed Gumbel noise; records sampled log-probs.

    Call ``t`` (0-based; one call per decoding step) uses the noise of :func:`gumbel_noise` with the
    keys of :func:`row_step_keys` for ``t``: one batched hash per step, no per-row Python loop.
    """

    def __init__(self, seeds: list[int], sampling: SamplingConfig, device):
        self.sampling = sampling
        self.greedy = sampling.temperature == 0
        self.seeds = torch.tensor([_signed(s, 64) for s in seeds], dtype=torch.int64, device=device)
        self.step = 0
        self._offsets: Tensor | None = None
        self.logprobs: list[Tensor] = []

    def noise(self, vocab: int) -> Tensor:
        """Gumbel noise ``[B, vocab]`` of the current step (does not advance the step)."""
        return gumbel_noise(row_step_keys(self.seeds, self.step), self._vocab_offsets(vocab, self.seeds.device))

    def _vocab_offsets(self, vocab: int, device) -> Tensor:
        if self._offsets is None or self._offsets.shape[0] != vocab or self._offsets.device != device:
            self._offsets = vocab_offsets(vocab, device)
        return self._offsets

    def choose(self, scores: Tensor) -> Tensor:
        """The sampled token ``[B]`` of this decoding step for raw logits ``scores [B, V]``."""
        s = self.sampling
        if self.greedy:
            z = scores.float()
            choice = z.argmax(-1)
        else:
            z = filter_logits(scores, s.temperature, s.top_k, s.top_p)
            keys = row_step_keys(self.seeds, self.step).to(z.device)
            choice = gumbel_argmax(z, keys, self._vocab_offsets(z.shape[-1], z.device))
        self.step += 1
        if s.logprobs:
            self.logprobs.append(torch.log_softmax(z, -1).gather(-1, choice[:, None]).squeeze(-1))
        return choice

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """As a ``generate()`` logits processor: ``generate`` takes the arg-max of what we return,
        so return 0 at the choice and -inf elsewhere."""
        choice = self.choose(scores)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, choice[:, None], 0.0)
        return out


def _takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the model's forward takes ``logits_to_keep``; a peft wrapper forwards its keyword
    arguments to the model it wraps, so that model's signature decides."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


class _ForwardStepper:
    """Decoding steps through the model's own forward and ``DynamicCache`` (``rollout.hf_decoder=forward``,
    and the fallback of ``loop`` for models :mod:`arlopti.rollout.kv_decode` does not run)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.keep = {"logits_to_keep": 1} if _takes_logits_to_keep(model) else {}
        self.cache = None

    def prefill(self, ids: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **self.keep)
        self.cache = out.past_key_values
        return out.logits

    def step(self, tokens: Tensor, pos: Tensor, mask: Tensor) -> Tensor:
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=pos, past_key_values=self.cache,
                         use_cache=True, **self.keep)
        self.cache = out.past_key_values
        return out.logits


def stepper_for(model: nn.Module, capacity: int, decoder: str = "loop", packed: PackedLinears | None = None):
    """The decoding steps :func:`decode` runs: :class:`~arlopti.rollout.kv_decode.KVDecoder` under
    ``loop`` where it supports the model (on ``packed`` projections when given), else the model's
    forward (:class:`_ForwardStepper`)."""
    if decoder == "loop" and unsupported_reason(model) is None:
        return KVDecoder(model, capacity, packed)
    return _ForwardStepper(model)


def decode(model: nn.Module, ids: Tensor, mask: Tensor, sampler: _GumbelSampler, max_new_tokens: int,
           eos_ids: list[int], pad: int, min_new_tokens: int = 0, stepper=None) -> Tensor:
    """Sample up to ``max_new_tokens`` tokens after left-padded prompts ``ids``/``mask [B, S]``.

    Returns the new tokens ``[B, n]``, ``n ≤ max_new_tokens``: a row that emitted an EOS holds
    ``pad`` after it, and the loop ends when every row has (or at the limit). This is what
    ``generate(do_sample=False, logits_processor=[sampler])`` does for a decoder-only model, step
    for step — positions ``cumsum(mask) − 1`` (0 on padding), one prefill then one KV-cached
    forward per token, the last position's logits in fp32, EOS banned for the first
    ``min_new_tokens`` tokens, finished rows fed ``pad`` — without ``generate``'s per-step
    bookkeeping (input preparation, mask re-derivation, processor and stopping-criteria lists),
    a fixed cost per decoding step that weighs on small models (``benchmarks/bench_decode.py``).
    ``stepper`` runs the forwards (default :func:`stepper_for`: the direct KV-cache step where the
    model allows it; the same logits either way). Unlike ``generate`` it applies no other logits
    processor from the model's generation config (repetition penalty and the like): the tokens are
    sampled from the policy the learner trains, which is what the rollout log-probs assume.
    """
    batch = ids.shape[0]
    stepper = stepper or stepper_for(model, ids.shape[1] + max_new_tokens)
    pos = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 0)
    logits = stepper.prefill(ids, mask, pos)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=ids.device)
    alive = torch.ones(batch, dtype=torch.bool, device=ids.device)
    step_pos = pos[:, -1:]
    tokens: list[Tensor] = []
    for t in range(max_new_tokens):
        logits = logits[:, -1, :].float()  # the last forward's own output: masked in place below
        if t < min_new_tokens:
            logits[:, eos] = float("-inf")
        choice = torch.where(alive, sampler.choose(logits), pad)
        tokens.append(choice)
        alive &= ~torch.isin(choice, eos)
        if t + 1 == max_new_tokens or not bool(alive.any()):
            break
        mask = torch.cat([mask, mask.new_ones(batch, 1)], 1)
        step_pos = step_pos + 1
        logits = stepper.step(choice[:, None], step_pos, mask)
    return torch.stack(tokens, 1)


def _fsdp_unsharded(module: nn.Module):
    """Unshard every FSDP2 module under ``module`` for generate(); a no-op for plain modules."""
    return unsharded_for_generate(module)


#: ``rollout.hf_decoder``'s choices (the config reads them here): how the HF engine decodes, the
#: same tokens either way (tested). ``loop`` and ``forward`` are :func:`decode` with either stepper;
#: ``generate`` passes the sampler as generate()'s logits processor.
DECODERS = {"loop": "our loop; Llama/Qwen2 decoders step over a preallocated KV cache (arlopti.rollout.kv_decode), "
                    "other models through their forward; requests with stop strings use generate()",
            "forward": "our loop over the model's own forward and DynamicCache (the loop before issue 36)",
            "generate": "transformers' generate()"}


class HFEngine(RolloutEngine):
    """Sampling on the live policy. ``policy`` is a ``PolicyLM`` (or any module with ``.hf``).

    ``decoder`` (:data:`DECODERS`): ``"loop"`` (default) and ``"forward"`` decode with :func:`decode`,
    ``"generate"`` with HF ``generate``; all three run the same arithmetic and sampler and give the
    same tokens; stop strings, which need detokenising every step, always go through ``generate``.
    ``min_new_tokens``: every response is at least this long (EOS is banned before), under every
    decoder; None takes the model's ``generation_config.min_new_tokens``. ``packed``: the ``loop``
    decoder's fp32 CPU projections run on oneDNN-packed weights (module docstring; not under
    autocast)."""

    @classmethod
    def from_config(cls, rollout_cfg, policy: nn.Module, tokenizer,
                    autocast_dtype: torch.dtype | None = None) -> "HFEngine":
        """The engine the ``rollout`` settings describe."""
        return cls(policy, tokenizer, rollout_cfg.generation_batch_size, autocast_dtype=autocast_dtype,
                   decoder=rollout_cfg.hf_decoder, packed=rollout_cfg.hf_packed)

    def __init__(self, policy: nn.Module, tokenizer, generation_batch_size: int = 64,
                 autocast_dtype: torch.dtype | None = None, decoder: str = "loop",
                 min_new_tokens: int | None = None, packed: bool = True):
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"rollout.hf_decoder={decoder!r}: choose one of {sorted(DECODERS)}")
        self.policy = policy
        self.tokenizer = tokenizer
        self.generation_batch_size = generation_batch_size
        self.autocast_dtype = autocast_dtype
        self.decoder = decoder
        self.min_new_tokens = min_new_tokens
        use_packed = packed and decoder == "loop" and autocast_dtype is None and unsupported_reason(self.hf) is None
        self.packed = PackedLinears() if use_packed else None

    def _load_weights(self, policy) -> None:
        """Re-pack what the update changed (the sync's time, :class:`~arlopti.rollout.engine.EngineStats`)."""
        t0 = time.perf_counter()
        self._refresh_packed()
        self.stats.last_sync_seconds = time.perf_counter() - t0

    def _refresh_packed(self) -> None:
        # the policy may be sharded (FSDP2) after the engine was built: then the step runs the modules
        if self.packed is not None and unsupported_reason(self.hf) is None:
            self.packed.refresh(projection_groups(self.hf), self.generation_batch_size)

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
        eos_set = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        amp = (torch.autocast(device_type=device.type, dtype=self.autocast_dtype)
               if self.autocast_dtype is not None else contextlib.nullcontext())
        with amp:
            if self.decoder != "generate" and not sampling.stop:
                self._refresh_packed()  # a no-op unless the weights changed since the last sync
                stepper = stepper_for(self.hf, width + sampling.max_new_tokens, self.decoder, self.packed)
                new = decode(self.hf, ids, mask, sampler, sampling.max_new_tokens, sorted(eos_set), pad,
                             self._min_new_tokens(), stepper).tolist()
            else:
                new = self._hf_generate(ids, mask, pad, eos, sampler, sampling)[:, width:].tolist()
        lps = torch.stack(sampler.logprobs, 1).tolist() if sampling.logprobs and sampler.logprobs else None
        return [self._completion(seq, lps[r] if lps is not None else None, eos_set, pad, sampling)
                for r, seq in enumerate(new)]

    def _min_new_tokens(self) -> int:
        if self.min_new_tokens is not None:
            return self.min_new_tokens
        return self.hf.generation_config.min_new_tokens or 0

    def _hf_generate(self, ids: Tensor, mask: Tensor, pad: int, eos, sampler: _GumbelSampler,
                     sampling: SamplingConfig) -> Tensor:
        from transformers import LogitsProcessorList

        kwargs = dict(
            input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens, do_sample=False,
            logits_processor=LogitsProcessorList([sampler]), pad_token_id=pad, eos_token_id=eos,
            use_cache=True, num_beams=1, temperature=None, top_p=None, top_k=None,
            min_new_tokens=self._min_new_tokens(),
        )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        return self.hf.generate(**kwargs)

    def _completion(self, seq: list[int], logprobs: list[float] | None, eos_set: set, pad: int,
                    sampling: SamplingConfig) -> Completion:
        """One row's new tokens, cut after its first EOS (kept: the policy must learn to stop)."""
        cut, reason = len(seq), "length"
        for t, token in enumerate(seq):
            if token in eos_set:
                cut, reason = t + 1, "stop"
                break
        seq = seq[:cut]
        if reason == "length" and sampling.stop:
            # generate() pads rows it stopped on a stop string; drop that padding
            while seq and seq[-1] == pad and pad not in eos_set:
                seq.pop()
            if len(seq) < sampling.max_new_tokens:
                reason = "stop"
        text = self.tokenizer.decode(seq, skip_special_tokens=True)
        # the log-probs of the tokens kept: the sampler also scored the padding dropped above
        return Completion(token_ids=seq, text=text, finish_reason=reason,
                          logprobs=logprobs[:len(seq)] if logprobs is not None else None)
