"""LoRA on the policy (arlopti/models/lora.py): config checks, the adapters-off reference, and the
gradient equivalence of one AR + Lopti step with a hand-built step on the LoRA parameters only."""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import pytest
import torch

from arlopti.algorithms.advantages import grpo_advantages
from arlopti.config import (AlgorithmConfig, ConfigError, DapoConfig, LoptiConfig, LoraConfig, ModelConfig,
                            OptimConfig, RolloutConfig, RunConfig, SizesConfig, TokenMethodConfig, validate_run)
from arlopti.models.lora import (ALL_LINEAR, adapters_disabled, apply_lora, base_identity, check_base_identity,
                                 saved_module_names,
                                  is_lora, resolve_targets)
from arlopti.learner.module import GRPOModule
from arlopti.learner.policy import PolicyLM
from arlopti.models.loading import build_tiny_model
from helpers.fixed_rollouts import FixedEngine
from helpers.toy import ToyDataModule, toy_trainer

LORA = LoraConfig(r=4, alpha=8.0)


def run_cfg(algo: AlgorithmConfig, lora: LoraConfig = LORA, optim: OptimConfig | None = None, **sizes) -> RunConfig:
    s = dict(prompts_per_step=2, group_size=4, mini_batch_size=8, micro_batch_size=4, logprob_micro_batch_size=8)
    s.update(sizes)
    return RunConfig(algorithm=algo, sizes=SizesConfig(**s), model=ModelConfig(lora=lora),
                     optim=optim or OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=12))


def fit(module: GRPOModule, tok, fixed: bool = True) -> GRPOModule:
    if fixed:
        module.rollout_engine = FixedEngine(tok)
    toy_trainer().fit(module, datamodule=ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=256))
    return module


# ---------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("bad, key", [(LoraConfig(r=-1), "model.lora.r"), (LoraConfig(r=8, alpha=0.0), "model.lora.alpha"),
                                      (LoraConfig(r=8, alpha=-2.0), "model.lora.alpha")])
def test_bad_rank_or_alpha_is_refused_naming_the_key(bad, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_run(RunConfig(model=ModelConfig(lora=bad)))


@pytest.mark.parametrize("overrides, match", [
    (dict(lora=LoraConfig(r=0), backend="vllm"), r"rollout\.lora_sync=adapter applies to LoRA runs.*model\.lora\.r > 0"),
    (dict(lora=LoraConfig(r=8), backend="hf"), (r"rollout\.lora_sync=adapter .* rollout\.backend=hf samples from "
                                                r"the policy itself"))])
def test_lora_sync_adapter_where_nothing_reads_it_is_refused(overrides, match):
    cfg = RunConfig(model=ModelConfig(lora=overrides["lora"]),
                    rollout=RolloutConfig(backend=overrides["backend"], lora_sync="adapter"))
    with pytest.raises(ConfigError, match=match):
        validate_run(cfg)
    validate_run(RunConfig(model=ModelConfig(lora=LoraConfig(r=8)), rollout=RolloutConfig(backend="vllm",
                                                                                          lora_sync="adapter")))


def test_all_linear_names_the_decoder_linears_of_qwen2_and_llama(tiny_model, tiny_llama):
    for model in (tiny_model, tiny_llama):
        assert resolve_targets(model, ["all-linear"]) == list(ALL_LINEAR)
    assert resolve_targets(tiny_model, ["q_proj", "v_proj", "q_proj"]) == ["q_proj", "v_proj"]


def test_a_target_matching_nothing_names_the_models_modules(tiny_model):
    with pytest.raises(ConfigError, match=r"'qkv_proj' matches no module.*'down_proj'.*'q_proj'"):
        resolve_targets(tiny_model, ["q_proj", "qkv_proj"])


def test_off_by_default_and_r_zero_or_null_is_full_parameter(tiny_model):
    assert ModelConfig().lora.r == 0
    for off in (LoraConfig(), LoraConfig(r=None)):
        assert apply_lora(tiny_model, off) is tiny_model


def test_adapters_train_alone_start_at_the_base_and_leave_the_rng_alone(tiny_tokenizer):
    base = build_tiny_model(tiny_tokenizer)
    ids = torch.randint(3, 200, (2, 10))
    mask = torch.ones_like(ids)
    want, _ = PolicyLM(copy.deepcopy(base))(ids, mask, 4)
    torch.manual_seed(1)
    state = torch.get_rng_state()
    peft_model = apply_lora(base, LoraConfig(r=4, modules_to_save=["norm"]))
    assert torch.equal(torch.get_rng_state(), state)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable)
    got, _ = PolicyLM(peft_model)(ids, mask, 4)
    assert torch.equal(got, want), "B = 0: the adapted model starts as the base"
    saved = peft_model.state_dict()
    assert set(saved) == set(trainable), "a LoRA state dict holds the trainable tensors only"


def test_base_identity_tells_bases_apart(tiny_tokenizer):
    from arlopti.config import TinyModelConfig

    a = base_identity(build_tiny_model(tiny_tokenizer))
    assert a == base_identity(build_tiny_model(tiny_tokenizer))
    b = base_identity(build_tiny_model(tiny_tokenizer, TinyModelConfig(seed=1)))
    check_base_identity(a, a, "resume")
    with pytest.raises(ConfigError, match="another base model.*different weights"):
        check_base_identity(a, b, "resume")


# ---------------------------------------------------------------------------------------- the reference


def test_reference_is_the_policy_with_adapters_off_and_no_copy_is_loaded(tiny_tokenizer, monkeypatch):
    cfg = run_cfg(AlgorithmConfig(kl_coef=0.1), optim=OptimConfig(lr=5e-2))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=2)
    assert module.ref is None and is_lora(module.policy)
    base = PolicyLM(build_tiny_model(tiny_tokenizer), cfg.model.logprob_impl).eval()
    seen = []
    import arlopti.learner.module as learner_module
    from arlopti.learner.policy import fill_logprobs

    real = learner_module.old_and_ref_log_probs

    def spy(policy, ref_model, exp, skip, chunk_rows, temperature, **kw):
        old, ref = real(policy, ref_model, exp, skip, chunk_rows, temperature, **kw)
        want = torch.zeros_like(ref)
        fill_logprobs(base, exp, list(range(len(exp))), want, 8, temperature)
        seen.append((ref * exp.response_mask, want * exp.response_mask, old.clone()))
        return old, ref

    monkeypatch.setattr(learner_module, "old_and_ref_log_probs", spy)
    fit(module, tiny_tokenizer)
    assert len(seen) == 2
    ref, want, old = seen[1]  # step 2: the adapters have moved, the reference has not
    assert torch.equal(ref, want), "reference log-probs are the base model's"
    assert not torch.allclose(old, ref), "the adapted policy differs from its reference after a step"
    assert module.last_step_context.metrics["update/kl"] > 0


# ---------------------------------------------------------------------------------------- every algorithm

ETA = 0.002  # splits a random tiny model's p_old (~1/vocab) in two
ALPHA = 0.3
# configs/algorithm/*.yaml and the token-method experiments, as AlgorithmConfig (DAPO without dynamic
# sampling, which only changes which prompts reach the learner)
EVERY_ALGORITHM = {
    "grpo": AlgorithmConfig(),
    "ar": AlgorithmConfig(ar_alpha=ALPHA),
    "lopti": AlgorithmConfig(lopti=LoptiConfig(enabled=True, eta=ETA)),
    "ar_lopti": AlgorithmConfig(ar_alpha=ALPHA, lopti=LoptiConfig(enabled=True, eta=ETA)),
    "rpp": AlgorithmConfig(advantage="reinforce_pp"),
    "gspo": AlgorithmConfig(policy_loss="gspo", clip_low=3e-4, clip_high=4e-4, dual_clip=None,
                            loss_agg="seq-mean-token-mean"),
    "cispo": AlgorithmConfig(policy_loss="cispo", clip_low=1.0, clip_high=0.28, dual_clip=None),
    "dapo": AlgorithmConfig(clip_high=0.28, kl_coef=0.0, dapo=DapoConfig(overlong_penalty=1.0)),
    "clip_cov": AlgorithmConfig(dual_clip=None, token_method=TokenMethodConfig(name="clip_cov")),
}


@pytest.mark.parametrize("name", list(EVERY_ALGORITHM))
def test_every_algorithm_trains_the_adapters_and_leaves_the_base(name, tiny_tokenizer):
    module = GRPOModule(run_cfg(EVERY_ALGORITHM[name]), tokenizer=tiny_tokenizer, total_rollout_steps=1)
    before = {k: v.detach().clone() for k, v in module.policy.named_parameters()}
    fit(module, tiny_tokenizer)
    assert module.last_step_context.metrics["reward/std"] > 0
    moved = {k for k, v in module.policy.named_parameters() if not torch.equal(v.detach(), before[k])}
    trainable = {k for k, v in module.policy.named_parameters() if v.requires_grad}
    assert moved and moved <= trainable, f"{name}: frozen weights moved: {sorted(moved - trainable)[:3]}"
    assert any("lora_B" in k for k in moved), f"{name}: the adapters did not train"


def test_ar_lopti_step_equals_a_hand_built_step_on_the_lora_parameters(tiny_tokenizer, monkeypatch):
    """One rollout step of AR + Lopti (low then high phase, one mini-batch, SGD) with LoRA: each
    optimizer step's gradients are those of the hand-written objective w.r.t. the LoRA parameters
    only (the base gets none), and SGD moves only those."""
    algo = AlgorithmConfig(kl_coef=0.0, ar_alpha=ALPHA, lopti=LoptiConfig(enabled=True, eta=ETA))
    cfg = run_cfg(algo, optim=OptimConfig(name="sgd", lr=1e-2, weight_decay=0.0, grad_clip=None))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    start = copy.deepcopy(module.policy)
    steps = []
    real = GRPOModule._step_or_skip

    def spy(self, loss, metrics, prefixes):
        named = dict(self.policy.named_parameters())
        steps.append({"params": {k: p.detach().clone() for k, p in named.items()},
                      "grads": {k: p.grad.clone() for k, p in named.items() if p.grad is not None}})
        return real(self, loss, metrics, prefixes)

    monkeypatch.setattr(GRPOModule, "_step_or_skip", spy)
    fit(module, tiny_tokenizer)
    assert len(steps) == 2, "Lopti: a low and a high phase step"
    exp = module.last_step_context.experience
    trainable = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    for s in steps:
        assert set(s["grads"]) == trainable, "only the LoRA parameters receive gradients"

    mask = exp.response_mask
    with torch.no_grad():
        old, _ = start.eval()(exp.input_ids, exp.attention_mask, exp.prompt_len, 1.0, with_entropy=False)
    adv = grpo_advantages(exp.rewards, exp.group_ids)[:, None] * mask
    adv = (ALPHA * old.exp() + 1 - ALPHA) * adv  # AR, once, from p_old
    low = (old.exp() < ETA).float() * mask
    for s, phase_mask in zip(steps, (low, mask - low)):
        hand = copy.deepcopy(start)
        hand.load_state_dict(s["params"], strict=False)
        for k, p in hand.named_parameters():
            if k in trainable:
                p.data.copy_(s["params"][k])
        logp, _ = hand.train()(exp.input_ids, exp.attention_mask, exp.prompt_len, 1.0, with_entropy=False)
        ratio = torch.exp(logp - old)
        assert float((ratio - 1).abs().max()) < 0.2, "the clip stays inactive for this hand-built loss"
        loss = -(ratio * adv * phase_mask).sum() / mask.sum()  # lopti.normalize=all: every valid token
        loss.backward()
        for k, p in hand.named_parameters():
            if k in trainable:
                torch.testing.assert_close(s["grads"][k], p.grad, rtol=1e-4, atol=1e-7, msg=k)
            else:
                assert p.grad is None
    after = dict(module.policy.named_parameters())
    for k, p in steps[1]["params"].items():  # the last SGD step moved exactly the LoRA parameters
        want = p - 1e-2 * steps[1]["grads"][k] if k in trainable else p
        torch.testing.assert_close(after[k].detach(), want, rtol=0, atol=1e-7, msg=k)
    base_after = dict(module.policy.named_parameters())
    for k, p in start.named_parameters():
        if k not in trainable:
            assert torch.equal(base_after[k].detach(), p.detach()), f"frozen base weight {k} changed"


def test_lora_with_fidelity_official_is_allowed_with_a_note(caplog):
    from arlopti.models.lora import note_fidelity

    assert note_fidelity(LoraConfig(r=0), "official") is None
    assert note_fidelity(LORA, "improved") is None
    with caplog.at_level("WARNING", logger="arlopti.models.lora"):
        msg = note_fidelity(LORA, "official")
    assert "full-parameter" in msg and msg in caplog.text


def test_gradient_checkpointing_still_reaches_the_adapters(tiny_tokenizer):
    """Frozen embeddings under activation checkpointing: the adapters must still get gradients
    (apply_lora makes the embedding output require grad)."""
    cfg = replace(run_cfg(AlgorithmConfig()), model=ModelConfig(lora=LORA, gradient_checkpointing=True))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer)
    with torch.no_grad():  # B = 0 would leave A without gradient whatever the wiring
        for n, p in module.policy.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)
    module.policy.train()
    ids = torch.randint(3, 200, (2, 10))
    logp, _ = module.policy(ids, torch.ones_like(ids), 4, 1.0, with_entropy=False)
    logp.sum().backward()
    grads = {n: p.grad for n, p in module.policy.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and float(g.abs().sum()) > 0 for g in grads.values())


# ---------------------------------------------------------------------------------------- refused or warned (issue 38)


@pytest.mark.parametrize("lora, key", [(LoraConfig(r=4, target_modules=["lm_head"]), "model.lora.target_modules"),
                                       (LoraConfig(r=4, modules_to_save=["lm_head"]), "model.lora.modules_to_save")])
def test_the_lm_head_is_refused_naming_the_key(tiny_model, lora, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + r": 'lm_head' names the LM head"):
        apply_lora(tiny_model, lora)


def test_a_modules_to_save_entry_matching_nothing_names_its_own_key(tiny_model):
    with pytest.raises(ConfigError, match=r"^model\.lora\.modules_to_save: 'nrom' matches no module.*'norm'"):
        apply_lora(tiny_model, LoraConfig(r=4, modules_to_save=["nrom"]))


def test_a_rank_no_smaller_than_the_layer_warns(tiny_tokenizer, caplog):
    """Hidden size 64: r = 4096 makes every adapter larger than its layer (98.8% of the model trainable)."""
    with caplog.at_level("WARNING", logger="arlopti.models.lora"):
        apply_lora(build_tiny_model(tiny_tokenizer), LoraConfig(r=8))
        assert "not low-rank" not in caplog.text
        apply_lora(build_tiny_model(tiny_tokenizer), LoraConfig(r=4096))
    assert re.search(r"model\.lora\.r=4096 is not low-rank for .*k_proj \(32 x 64\).*Use model\.lora\.r <= 21",
                     caplog.text), caplog.text


def lm_step(policy: PolicyLM, tok, steps: int = 3, lr: float = 1e-2) -> torch.optim.Optimizer:
    """AdamW steps of the trainable parameters on a random-token likelihood (a real gradient); the optimizer."""
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    ids = torch.randint(3, len(tok), (4, 16), generator=torch.Generator().manual_seed(0))
    policy.train()
    for _ in range(steps):
        lp, _ = policy(ids, torch.ones_like(ids), 4, 1.0, with_entropy=False)
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad()
    policy.eval()
    return opt


@pytest.mark.parametrize("lora", [LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"]),
                                  LoraConfig(r=4, modules_to_save=["embed_tokens"])], ids=["adapter", "copy"])
def test_adapting_a_tied_embedding_gives_the_head_its_own_copy(tiny_tokenizer, lora):
    """The tiny model ties its LM head to the embedding. An adapter (or a trained copy) on the embedding
    trains the input side only, so the head must stop sharing the matrix: then the merged model is the
    trained policy (before: up to 16.9 nats apart), and the base identity stays the base's."""
    from helpers.moved import assert_moved, snapshot

    fresh = build_tiny_model(tiny_tokenizer)
    assert fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight
    policy = PolicyLM(apply_lora(build_tiny_model(tiny_tokenizer), lora))
    base = policy.hf.get_base_model()
    assert base.config.tie_word_embeddings is False
    assert torch.equal(base.lm_head.weight, fresh.lm_head.weight) and not base.lm_head.weight.requires_grad
    assert base_identity(policy.hf) == base_identity(fresh), "resume and workers compare the base as loaded"
    before = snapshot(policy)
    print(assert_moved(before, policy, lm_step(policy, tiny_tokenizer), what="the tied-embedding policy"))
    assert torch.equal(base.lm_head.weight, fresh.lm_head.weight), "the head stays the base's matrix"
    ids = torch.randint(3, len(tiny_tokenizer), (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = policy(ids, torch.ones_like(ids), 4)
        merged = copy.deepcopy(policy.hf).merge_and_unload()
        got, _ = PolicyLM(merged)(ids, torch.ones_like(ids), 4)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def _plain_suffix(key: str, entry: str) -> bool:
    """peft before 0.22 (``utils/other.py``, ``_set_trainable``): a ``modules_to_save`` entry takes every module
    whose name ends with it."""
    return key.endswith(entry)


def _dotted_suffix(key: str, entry: str) -> bool:
    """peft 0.22 (``utils/other.py``, ``_is_valid_match``): the name equals the entry or ends with ``.<entry>``."""
    return key == entry or key.endswith("." + entry)


@pytest.mark.parametrize("entries, want", [
    (["norm"], ["model.norm"]),
    (["input_layernorm"], [f"model.layers.{i}.input_layernorm" for i in range(2)]),
    (["post_attention_layernorm", "norm"], [f"model.layers.{i}.post_attention_layernorm" for i in range(2)]
     + ["model.norm"]),
], ids=["norm", "input_layernorm", "both"])
def test_modules_to_save_reach_peft_as_full_names_that_both_peft_rules_take_alike(tiny_model, entries, want):
    keys = ["base_model.model." + n for n, _ in tiny_model.named_modules() if n]  # the names peft matches
    got = saved_module_names(tiny_model, entries)
    assert sorted(got) == sorted(want)
    for rule in (_plain_suffix, _dotted_suffix):
        assert sorted(k for k in keys if any(rule(k, f) for f in got)) == sorted("base_model.model." + n for n in want)
    if entries == ["norm"]:  # where the two rules part on the entry itself
        assert sum(_plain_suffix(k, "norm") for k in keys) > sum(_dotted_suffix(k, "norm") for k in keys) == 1


def test_the_installed_peft_trains_exactly_the_named_copies(tiny_tokenizer):
    peft_model = apply_lora(build_tiny_model(tiny_tokenizer), LoraConfig(r=4, modules_to_save=["norm"]))
    wrapped = [n for n, m in peft_model.get_base_model().named_modules() if hasattr(m, "modules_to_save")]
    assert wrapped == ["model.norm"]
    assert peft_model.peft_config["default"].modules_to_save == ["model.norm"]


def test_a_saved_name_that_is_another_modules_suffix_is_refused():
    from torch import nn

    class Odd(nn.Module):  # 'norm' and 'layernorm': peft before 0.22 would take both for 'norm'
        def __init__(self):
            super().__init__()
            self.norm, self.layernorm = nn.LayerNorm(4), nn.LayerNorm(4)

    with pytest.raises(ConfigError, match=r"^model\.lora\.modules_to_save: 'norm' is also a name suffix of "
                                          r"\['layernorm'\]"):
        saved_module_names(Odd(), ["norm"])
