"""The learner on multi-turn episodes: environment tokens get exactly zero gradient, no per-token metric or
token method reads them, and one turn with an environment trains bit for bit as a single response."""

from __future__ import annotations

import pytest
import lightning.pytorch as L
import torch

from arlopti.callbacks.rollout import RolloutCallback
from arlopti.config import (AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RolloutCorrectionConfig,
                            RunConfig, SizesConfig)
from arlopti.config.schema import EnvConfig, TokenMethodConfig
from arlopti.learner.module import GRPOModule
from arlopti.tasks.env.loading import register_env
from helpers.toy import ToyDataModule
from helpers.turns import CountEnv, NullEnv, ScriptedEngine

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

TRAINER = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
               limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False, enable_progress_bar=False,
               enable_model_summary=False)


def fit(module, env_cls, steps: int, *callbacks, group: int = 2):
    env = EnvConfig(env=register_env(env_cls)) if env_cls is not None else None
    dm = ToyDataModule(tokenizer=module.tokenizer, prompts_per_step=module.cfg.sizes.prompts_per_step,
                       max_prompt_length=256, seed=3)
    L.Trainer(callbacks=[RolloutCallback(group_size=group, env=env), *callbacks], **TRAINER).fit(module, datamodule=dm)
    assert module.rollout_step == steps


def oks(tok, ctx, seed):
    """A raw-text prompt's episode: two turns of seeded letters, then ``done``."""
    import random

    k = tok.decode(ctx, skip_special_tokens=False).count("ok ")
    return ("done" if k >= 2 else "".join(random.Random(seed).choice("abcdefgh") for _ in range(6))), False


class GradProbe(L.Callback):
    """Records, for every backward, the gradient at the final norm's output (the hidden state that predicts
    the next token: position P + k - 1 predicts response token k) with the ids of that forward."""

    def __init__(self):
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_start(self, trainer, module):
        hf = module.policy.hf
        box = {}
        hf.model.register_forward_pre_hook(lambda m, args, kw: box.update(ids=kw.get("input_ids", args[0] if args else None)),
                                     with_kwargs=True)

        def keep(m, args, out):
            if out.requires_grad:
                ids = box["ids"]
                out.register_hook(lambda g: self.seen.append((ids.detach().clone(), g.detach().clone())))

        hf.model.norm.register_forward_hook(keep)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.exp = batch.experience


def test_environment_tokens_get_exactly_zero_gradient(tiny_tokenizer):
    torch.manual_seed(0)
    algo = AlgorithmConfig(kl_coef=0.05, entropy_coef=0.01, ar_alpha=0.3,
                           lopti=LoptiConfig(enabled=True, eta=0.002),
                           rollout_correction=RolloutCorrectionConfig(mode="tis"))
    cfg = RunConfig(algorithm=algo, sizes=SizesConfig(prompts_per_step=2, group_size=2, mini_batch_size=4,
                                                      micro_batch_size=2, logprob_micro_batch_size=4),
                    optim=OptimConfig(lr=1e-3), rollout=RolloutConfig(temperature=1.0, max_new_tokens=16, seed=7,
                                                                      max_turns=3))
    module = GRPOModule(cfg, tokenizer=tiny_tokenizer, total_rollout_steps=1)
    module.rollout_engine = ScriptedEngine(tiny_tokenizer, oks)
    probe = GradProbe()
    fit(module, CountEnv, 1, probe)
    exp = probe.exp
    env = (exp.response_mask == 0) & (exp.attention_mask[:, exp.prompt_len:] == 1)
    assert int(env.sum()) > 20 and exp.turn_index is not None and int(exp.turn_index.max()) == 2
    checked = 0
    for ids, grad in probe.seen:
        for row in range(ids.shape[0]):
            match = [b for b in range(len(exp)) if torch.equal(exp.input_ids[b, :ids.shape[1]], ids[row])]
            assert match, "every micro-batch row is a row of the step's experience"
            b, p = match[0], exp.prompt_len
            width = ids.shape[1] - p
            g = grad[row, p - 1:p - 1 + width].abs().sum(-1)  # the hidden states predicting response tokens 0..
            e = env[b, :width]
            assert torch.all(g[e] == 0), "an environment token's prediction got a gradient"
            assert bool((g[~e & (exp.response_mask[b, :width] > 0)] > 0).any())
            checked += 1
    assert checked >= 8  # both phases' optimizer steps, every row


def letters(tok, ctx, seed):
    """Two turns: six seeded letters, then, after the reply, ``done`` and 1 to 8 letters (the final turn the toy
    task scores: the rewards of a group differ, so the advantages are not zero)."""
    import random

    rng = random.Random(seed)
    if "ok " in tok.decode(ctx, skip_special_tokens=False):
        return "done " + "abcdefgh"[:rng.randint(1, 8)], False
    return "".join(rng.choice("abcdefgh") for _ in range(6)), False


class EnvNoise(L.Callback):
    """Noise on the policy forward's outputs at the response positions of ``where`` ("env": the environment's
    tokens, "all": every token, None: none): log-probs lowered by up to 3 nats, entropies raised by up to 5,
    fresh on every forward, so logπ_old and logπ, and logπ_old and the engine's log-probs, disagree there."""

    def __init__(self, where: str | None):
        self.where, self.gen, self.exp = where, torch.Generator().manual_seed(1), None

    def on_train_start(self, trainer, module):
        if self.where:
            module.policy.register_forward_hook(self.noisy)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.exp = batch.experience  # built by the rollout callback, which runs first

    def noisy(self, policy, args, out):
        ids, exp = args[0], self.exp
        logp, ent, *rest = out
        rows = [next(b for b in range(len(exp)) if torch.equal(exp.input_ids[b, :ids.shape[1]], row)) for row in ids]
        r, p = logp.shape[1], exp.prompt_len
        mask = exp.attention_mask[rows, p:p + r].bool()
        if self.where == "env":
            mask &= exp.response_mask[rows, :r] == 0
        u = torch.rand(logp.shape, generator=self.gen) * mask
        return (logp - 3 * u, None if ent is None else ent + 5 * u, *rest)


def _noisy_step(tok, where: str | None):
    """One step with Archer (per-token clip bounds and KL weights from the entropy quantile of each response's
    tokens), Lopti, AR and the KL, two mini-batches (the second's ratio is off 1): its metrics and weights."""
    torch.manual_seed(0)
    algo = AlgorithmConfig(kl_coef=0.05, entropy_coef=0.01, ar_alpha=0.3, lopti=LoptiConfig(enabled=True, eta=0.002),
                           token_method=TokenMethodConfig(name="archer"))
    cfg = RunConfig(algorithm=algo, sizes=SizesConfig(prompts_per_step=2, group_size=2, mini_batch_size=2,
                                                      micro_batch_size=2, logprob_micro_batch_size=4),
                    optim=OptimConfig(lr=1e-2), rollout=RolloutConfig(temperature=1.0, max_new_tokens=16, seed=7,
                                                                      max_turns=2))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=1)
    module.rollout_engine = ScriptedEngine(tok, letters)
    noise = EnvNoise(where)
    fit(module, CountEnv, 1, noise)
    exp = noise.exp
    assert int(((exp.response_mask == 0) & (exp.attention_mask[:, exp.prompt_len:] == 1)).sum()) > 20
    metrics = {k: v for k, v in module.last_step_context.metrics.items() if not k.startswith("timing/")}
    return metrics, {k: v.detach().clone() for k, v in module.policy.named_parameters()}


def test_no_per_token_metric_or_token_method_reads_environment_tokens(tiny_tokenizer):
    """Noise on the environment tokens' log-probs and entropies changes no metric (the clip fractions, the
    entropy, the mismatch per probability bucket, the turns/* segments, ...) and no weight (Archer's per-token
    bounds and KL weights come from the entropy quantile of the sampled tokens only); the same noise on every
    token changes each of those metrics, so each would show environment tokens that entered it."""
    plain, w_plain = _noisy_step(tiny_tokenizer, None)
    env, w_env = _noisy_step(tiny_tokenizer, "env")
    every, w_every = _noisy_step(tiny_tokenizer, "all")
    assert env == plain
    assert all(torch.equal(w_env[k], w_plain[k]) for k in w_plain)
    assert plain["update/clip_frac_high"] > 0 and plain["update/clip_frac_low"] > 0  # the clips are active
    for k in ("update/clip_frac_low", "update/clip_frac_dual", "update/entropy", "update/kl",
              "mismatch/abs_diff_mean/0.00-0.25", "turns/later_turns/mismatch_abs_diff_mean"):
        assert every[k] != plain[k], k
    assert any(not torch.equal(w_every[k], w_plain[k]) for k in w_plain)


def _train(tok, env_cls):
    torch.manual_seed(0)
    cfg = RunConfig(algorithm=AlgorithmConfig(kl_coef=0.01, ar_alpha=0.3),
                    sizes=SizesConfig(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2,
                                      logprob_micro_batch_size=8),
                    optim=OptimConfig(lr=1e-3), rollout=RolloutConfig(temperature=1.0, max_new_tokens=12, seed=7))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=2)
    fit(module, env_cls, 2, group=4)
    return {k: v.detach().clone() for k, v in module.policy.named_parameters()}, module


def test_one_turn_with_an_environment_trains_bit_for_bit_as_a_single_response(tiny_tokenizer):
    """The turn loop with max_turns=1 (HF rollouts on the tiny model, an environment that never replies)
    against today's single-turn path: the same trained bytes, after weights that moved."""
    plain, m0 = _train(tiny_tokenizer, None)
    looped, m1 = _train(tiny_tokenizer, NullEnv)
    from arlopti.models.loading import build_tiny_model

    start = dict(build_tiny_model(tiny_tokenizer).named_parameters())
    assert any(not torch.equal(plain[k], start[k.removeprefix("hf.")]) for k in plain)  # the weights moved
    assert all(torch.equal(plain[k], looped[k]) for k in plain)
    assert m1.last_step_context.metrics["turns/mean"] == 1.0 and "turns/mean" not in m0.last_step_context.metrics
