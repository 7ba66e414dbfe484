"""The HF engine's sampler (``arlopti.rollout.hf``): hashed Gumbel noise, per-response reproducibility,
and the distribution of the sampled tokens.

* The integer hash is checked bit for bit against a pure-Python restatement of splitmix64 and
  MurmurHash3's fmix32 (unbounded ints reduced modulo 2**64 / 2**32), so torch's wrapping int64
  and int32 arithmetic is what we think.
* A response's tokens depend only on its own seed: the same (base seed, prompt index, sample
  index) gives the same tokens alone, inside a batch of other prompts of other lengths (other
  left padding), and with any ``generation_batch_size``.
* χ² goodness of fit: 40,000 draws through ``_GumbelSampler.__call__`` (the sampler's own noise
  path) from a fixed 6-way categorical are tested against its probabilities, and against 40,000
  ``torch.multinomial`` draws from the same distribution (χ² test of homogeneity). Both use fixed
  seeds, so the test is deterministic. Threshold p > 1e-3: a correct sampler fails it for about
  one seed in 1,000, while a wrong one (e.g. uniform noise instead of Gumbel, or a dropped
  temperature) gives p < 1e-100 at this size. Resolution: a shift of 0.01 in a probability of
  0.3 adds 40000·0.01²/0.3 ≈ 13 to χ² (p ≈ 0.02 with 5 degrees of freedom), so shifts of that
  order are near the edge; each cell is also checked to lie within 4.5 binomial standard
  deviations of its expectation.
"""

from __future__ import annotations

import math

import pytest
import torch

from arlopti.rollout import hf
from arlopti.rollout.seeds import sample_seed
from arlopti.rollout.engine import SamplingConfig

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)
DRAWS = 40_000
P_MIN = 1e-3


def _mix_ref(x: int) -> int:
    """splitmix64's finaliser on a Python int modulo 2**64 (Steele et al. 2014; Stafford's mix13)."""
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _fmix32_ref(x: int) -> int:
    """MurmurHash3's 32-bit finaliser on a Python int modulo 2**32."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


def _chi2_sf(stat: float, df: int) -> float:
    """Upper tail of the χ² distribution: Q(df/2, stat/2), the regularised upper incomplete gamma."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# ------------------------------------------------------------------------------------- the hash

def test_hash_matches_a_python_restatement_bit_for_bit():
    seeds = [sample_seed(5, i, j) for i in range(3) for j in range(2)] + [0, (1 << 63) - 1]
    st = torch.tensor(seeds, dtype=torch.int64)
    offsets = hf.vocab_offsets(11, "cpu")
    for step in (0, 1, 37):
        keys = hf.row_step_keys(st, step)
        want = [_mix_ref(s + (step + 1) * 0x9E3779B97F4A7C15) & M32 for s in seeds]
        assert keys.dtype == torch.int32 and [k & M32 for k in keys.tolist()] == want
        g = hf.gumbel_noise(keys, offsets)
        for r, key in enumerate(want):
            for v in range(11):
                m = _fmix32_ref(key + v * 0x9E3779B9) >> (32 - 23)
                u = (m + 0.5) / 2**23
                assert g[r, v].item() == pytest.approx(-math.log(-math.log(u)), abs=2e-6), (step, r, v)


def test_noise_is_finite_and_steps_and_rows_differ():
    sampler = hf._GumbelSampler([1, 2], SamplingConfig(temperature=1.0), "cpu")
    a = sampler.noise(1000)
    sampler.step += 1
    b = sampler.noise(1000)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert not torch.equal(a[0], a[1]) and not torch.equal(a, b)
    # Gumbel(0, 1): mean = Euler–Mascheroni γ ≈ 0.5772, variance π²/6 ≈ 1.645 (4,000 draws: loose bounds)
    x = torch.cat([a.flatten(), b.flatten()]).double()
    assert abs(x.mean().item() - 0.5772) < 0.07 and abs(x.var().item() - math.pi**2 / 6) < 0.2


# --------------------------------------------------------------------- per-response reproducibility

@pytest.fixture()
def engine(tiny_tokenizer, tiny_model):
    from arlopti.rollout.hf import HFEngine

    tiny_model.generation_config.min_new_tokens = 10  # no EOS before 10 tokens: longer comparisons
    return HFEngine(tiny_model, tiny_tokenizer, generation_batch_size=64)


def _prompts(tok):
    texts = ["Zoey said that Oliver is a knight.", "Is Ava a knave?", "A very long prompt " * 5, "Hi"]
    return [tok(t)["input_ids"] for t in texts]


def test_a_response_depends_only_on_its_own_seed(engine, tiny_tokenizer):
    prompts = _prompts(tiny_tokenizer)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=123, logprobs=True)
    together = engine.generate(prompts, 3, sampling)
    assert len({tuple(c.token_ids) for cs in together for c in cs}) > 6  # really sampled, not constant
    for bs in (1, 5):  # other chunkings of the same 12 jobs
        engine.generation_batch_size = bs
        chunked = engine.generate(prompts, 3, sampling)
        assert [[c.token_ids for c in cs] for cs in chunked] == [[c.token_ids for c in cs] for cs in together]
    engine.generation_batch_size = 64
    # prompt 0 alone (its seeds are (123, 0, j) in both calls)
    alone = engine.generate([prompts[0]], 3, sampling)
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in together[0]]
    for a, b in zip(alone[0], together[0]):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    # the same prompt among others with longer/shorter prompts (different left padding)
    mixed = engine.generate([prompts[0], prompts[2]], 3, sampling)
    assert [c.token_ids for c in mixed[0]] == [c.token_ids for c in together[0]]
    # another base seed changes the responses
    other = engine.generate([prompts[0]], 3, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=124))
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in together[0]]


def test_the_sampler_row_depends_only_on_its_seed_and_step():
    seeds = [sample_seed(9, i, 0) for i in range(5)]
    scores = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    s = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9)
    batch = hf._GumbelSampler(seeds, s, "cpu")
    single = hf._GumbelSampler(seeds[3:4], s, "cpu")
    for _ in range(4):  # four decoding steps
        got = batch(None, scores).argmax(-1)
        one = single(None, scores[3:4]).argmax(-1)
        assert got[3].item() == one.item()


# ------------------------------------------------------------------------------- distribution

def _sampled_counts() -> torch.Tensor:
    """``DRAWS`` tokens from the categorical ``P`` through the sampler: 2,000 rows × 20 steps."""
    rows, steps = 2000, DRAWS // 2000
    sampler = hf._GumbelSampler([sample_seed(2026, i, 0) for i in range(rows)],
                                SamplingConfig(temperature=1.0), "cpu")
    scores = P.log().float().expand(rows, -1).contiguous()
    counts = torch.zeros(len(P), dtype=torch.float64)
    for _ in range(steps):
        choice = sampler(None, scores).argmax(-1)
        counts += torch.bincount(choice, minlength=len(P)).double()
    return counts


def test_sampled_tokens_follow_the_categorical_chi2():
    counts = _sampled_counts()
    expected = DRAWS * P
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert _chi2_sf(stat, len(P) - 1) > P_MIN, (counts.tolist(), stat)
    sd = (DRAWS * P * (1 - P)).sqrt()
    assert ((counts - expected).abs() < 4.5 * sd).all(), (counts.tolist(), expected.tolist())


def test_sampled_tokens_match_torch_multinomial_chi2_homogeneity():
    ours = _sampled_counts()
    ref = torch.bincount(torch.multinomial(P, DRAWS, replacement=True, generator=torch.Generator().manual_seed(7)),
                         minlength=len(P)).double()
    table = torch.stack([ours, ref])  # 2 × K contingency table
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    assert _chi2_sf(stat, len(P) - 1) > P_MIN, (ours.tolist(), ref.tolist(), stat)
