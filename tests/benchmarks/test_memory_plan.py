"""benchmarks/memory_plan.py: its terms against hand-computed numbers, and the paper experiments'
vLLM settings against the plan (each fits on 4 and 8 x 80 GB with the stated margin)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_plan.py"
_spec = importlib.util.spec_from_file_location("memory_plan", PATH)
mp = importlib.util.module_from_spec(_spec)
sys.modules["memory_plan"] = mp  # dataclasses look the module up
_spec.loader.exec_module(mp)
GB = 1e9


def test_parameter_counts_match_the_published_models():
    assert round(mp.MODELS["3b"].params / 1e9, 2) == 3.09  # Qwen2.5-3B-Instruct
    assert round(mp.MODELS["7b"].params / 1e9, 2) == 7.62  # Qwen2.5-7B


def test_7b_on_4_gpus_term_by_term():
    """The review's figures (../shared/notes/gpu_path_review.md R2), each recomputed by hand."""
    m = mp.MODELS["7b"]
    t = mp.terms(m, 4, micro=8, tokens=4496)
    p, vh = m.params, 152064 * 3584
    assert (t["master weights fp32 (4P/N)"] + t["AdamW moments fp32 (8P/N)"] + t[
        "gradients fp32 (4P/N; freed before the rollout)"] + t["reference model bf16 (2P/N; model.ref_dtype)"]) \
        == pytest.approx(18 * p / 4)
    assert 18 * p / 4 / GB == pytest.approx(34.3, abs=0.05)  # the resident state the review checked
    assert t["root unsharded bf16: embedding, head, norm (2·root)"] == 2 * (2 * vh + 3584)  # 2.2 GB
    assert t["fused log-prob head gradient fp32 (4·V·h; ops/logprobs.py _fused_backward)"] == 4 * vh  # 2.2 GB
    # SwiGLU recompute: 8 x 4496 tokens x (20·3584 + 4·4·128 + 8·18944) bytes = 8.1 GB ("about 8 GB, not 4.4")
    assert t["one layer recomputed (micro·T·(20h + 4·kv·hd + 8i))"] == 8 * 4496 * (20 * 3584 + 4 * 4 * 128 + 8 * 18944)
    assert t["one layer recomputed (micro·T·(20h + 4·kv·hd + 8i))"] / GB == pytest.approx(8.1, abs=0.05)
    sync = t["sync transient: largest tensor gathered fp32 + its bf16 copy (weight_sync.stream_tensors)"]
    assert sync == 6 * vh and sync / GB == pytest.approx(3.27, abs=0.01)


def test_vllm_reserves_a_share_of_the_total_memory_so_0_6_was_over_the_card_for_7b_on_4_gpus():
    """0.6 x 85.5 GB was README's 7B setting. With the gradients kept and the sync inside the awake
    reservation (before zero_grad and the staged wake) it is over the card; with both it still leaves
    less than 8 GB, hence 0.45."""
    r = mp.plan(mp.MODELS["7b"], 4, 0.6, 8, 4496)
    assert r["rollout"] == pytest.approx(r["no_grads"] + 0.6 * mp.GPU_TOTAL_GB + mp.CONTEXT_GB)
    t = r["terms"]
    before = (r["rollout"] + t["gradients fp32 (4P/N; freed before the rollout)"]
              + t["sync transient: largest tensor gathered fp32 + its bf16 copy (weight_sync.stream_tensors)"])
    assert before > mp.GPU_TOTAL_GB
    assert r["margin"] < 8


def test_every_paper_experiment_fits_on_4_and_8_gpus_with_the_stated_margin():
    exps = mp.paper_experiments()
    assert {"kk_grpo", "kk_ar_lopti", "dsr_grpo", "orz_ar_lopti"} <= exps.keys()
    for name, e in exps.items():
        assert e["sleep_level"] == 2, f"{name}: a full sync follows every rollout, so sleep level 2"
        for model in {e["model"], "7b"}:  # the K&K experiments also run with model=qwen2.5-7b-instruct-1m
            for gpus in (4, 8):
                r = mp.plan(mp.MODELS[model], gpus, e["util"], 8, 4496)
                assert r["fits"] and r["margin"] >= mp.MARGIN_GB, (name, model, gpus, r["margin"])


def test_docs_scaling_shows_the_tables_the_plan_prints():
    docs = (PATH.parents[1] / "docs" / "scaling.md").read_text()
    for table in (mp.table(0.45, 8, 4496), mp.terms_table(mp.MODELS["7b"], 4, 8, 4496), mp.experiments_table(8, 4496)):
        assert table in docs, "docs/scaling.md is stale: paste the output of python benchmarks/memory_plan.py"


def test_a_reward_model_counts_on_every_peak_and_its_forward_on_the_rollouts():
    """task.reward_model (issue 45): its bf16 weights stay on every rank, its forward runs before vLLM sleeps."""
    m, rm = mp.MODELS["7b"], mp.MODELS["3b"]
    base, with_rm = mp.plan(m, 4, 0.45, 8, 4496), mp.plan(m, 4, 0.45, 8, 4496, reward_model=rm, reward_batch=4)
    t = mp.reward_terms(rm, 4, 4496)
    weights = t["reward model weights bf16 (2·P_rm; task.reward_model, whole on every rank)"]
    assert weights == 2 * (rm.layers * rm.layer_params + 151936 * 2048 + 2 * 2048)  # no LM head: a score row
    forward = sum(t.values()) - weights
    assert forward == 4 * 4496 * mp.recompute_bytes_per_token(rm) + 4 * 4496 ** 2 * 2
    for peak in ("update", "sync"):
        assert with_rm[peak] == pytest.approx(base[peak] + weights / GB)
    assert with_rm["rollout"] == pytest.approx(base["rollout"] + (weights + forward) / GB)
    assert with_rm["max_util"] < base["max_util"]
    assert mp.plan(m, 4, 0.45, 8, 4496, reward_model=None) == base  # without one: the tables of docs/scaling.md
