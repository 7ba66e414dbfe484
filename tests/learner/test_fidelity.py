"""``fidelity=official``: the config group sets every official switch, and the learner under those
switches takes exactly the official update.

The replay restates the official AR + Lopti update (zhyang2226/AR-Lopti: ``dp_actor.update_policy``,
``core_algos.compute_policy_loss`` / ``kl_penalty``, the ``update_actor`` loop of
``fsdp_workers.py`` and verl's ``get_constant_schedule_with_warmup``, as summarised in
../shared/notes/ar_lopti_spec.md §2.6, §2.7, §2.9) in plain torch on the HF model's full logits,
independent of ``arlopti.algorithms``: per rollout step, old and reference log-probs; GRPO
advantages (unbiased group std + 1e-6); AR; phases ``[p_old < η, rest]``; per phase one
``update_actor`` call (a pass over the mini-batches at lr × min(1, calls / max(1, warmup)), so
the first call runs at lr 0), each mini-batch: per-micro-batch token-mean of the dual-clipped PPO
loss plus β·low_var_kl on the phase's tokens, divided by the number of micro-batches, clip 1.0,
AdamW step, *also when the phase has no token* (zero gradients: weight decay and momentum act).
"""

from __future__ import annotations

import pytest
import torch
from arlopti.config.compose import compose

from arlopti.config import AlgorithmConfig, LoptiConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
from arlopti.learner.module import GRPOModule
from arlopti.learner.policy import position_ids_from_mask
from arlopti.entry.train import run_config
from helpers.fixed_rollouts import FixedEngine
from helpers.toy import ToyDataModule, toy_trainer
from conftest import REPO_ROOT

T = 1.0
SIZES = dict(prompts_per_step=2, group_size=4, mini_batch_size=4, micro_batch_size=2, logprob_micro_batch_size=8)


def compose_train(*overrides: str):
    return compose(list(overrides), config_dir=REPO_ROOT / "configs")


def test_official_group_sets_every_switch_and_improved_sets_none():
    official = compose_train("experiment=kk_ar_lopti", "fidelity=official")
    improved = compose_train("experiment=kk_ar_lopti")
    run_o, run_i = run_config(official), run_config(improved)
    assert (run_o.algorithm.token_mean_scope, run_i.algorithm.token_mean_scope) == ("microbatch", "minibatch")
    assert (run_o.algorithm.lopti.empty_phase, run_i.algorithm.lopti.empty_phase) == ("step", "skip")
    assert (run_o.optim.lr_schedule, run_i.optim.lr_schedule) == ("verl", "linear_warmup")
    assert (run_o.optim.scheduler_interval, run_i.optim.scheduler_interval) == ("phase", "optimizer_step")
    assert (official.data.val_max_prompt_length, improved.data.get("val_max_prompt_length")) == (1024, None)
    assert official.tasks.kk.official_cut is True and improved.tasks.kk.official_cut is False
    assert official.tasks.math.grader == improved.tasks.math.grader == "official"
    assert (run_o.model.spread_master_weights, run_i.model.spread_master_weights) == (False, True)
    # everything else is the experiment's
    assert run_o.algorithm.ar_alpha == run_i.algorithm.ar_alpha == 0.3
    assert run_o.algorithm.lopti.eta == run_i.algorithm.lopti.eta == 0.5
    # fidelity comes after the experiment, and the command line still wins
    cli = compose_train("experiment=kk_ar_lopti", "fidelity=official", "algorithm.token_mean_scope=minibatch")
    assert run_config(cli).algorithm.token_mean_scope == "minibatch"


# ------------------------------------------------------------------ the official update, restated
def _logprobs(hf, exp, rows, grad: bool):
    ids, att = exp.input_ids[rows], exp.attention_mask[rows]
    with torch.set_grad_enabled(grad):
        logits = hf(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits
        logp = torch.log_softmax(logits[:, exp.prompt_len - 1:-1].float() / T, -1)
        return logp.gather(-1, ids[:, exp.prompt_len:, None]).squeeze(-1)


def _official_rollout_step(hf, ref_hf, opt, exp, calls: int, algo: AlgorithmConfig, o: OptimConfig) -> int:
    mask = exp.response_mask
    rows = list(range(len(exp)))
    old = _logprobs(hf, exp, rows, grad=False) * mask
    ref = _logprobs(ref_hf, exp, rows, grad=False)
    r, g = exp.rewards, exp.group_ids
    adv = torch.zeros_like(r)
    for gid in g.unique():
        sel = g == gid
        adv[sel] = (r[sel] - r[sel].mean()) / (r[sel].std() + 1e-6)
    adv = adv[:, None] * mask
    adv = (algo.ar_alpha * old.exp() + 1 - algo.ar_alpha) * adv
    low = (old.exp() < algo.lopti.eta) & mask.bool()
    for phase in (low, mask.bool() & ~low):
        for group in opt.param_groups:
            group["lr"] = o.lr * min(1.0, calls / max(1, o.warmup_steps))
        for lo in range(0, len(rows), SIZES["mini_batch_size"]):
            mini = rows[lo:lo + SIZES["mini_batch_size"]]
            micros = [mini[i:i + SIZES["micro_batch_size"]] for i in range(0, len(mini), SIZES["micro_batch_size"])]
            opt.zero_grad()
            for micro in micros:
                logp = _logprobs(hf, exp, micro, grad=True)
                m, pm, a = mask[micro], phase[micro].float(), adv[micro] * phase[micro]
                ratio = torch.exp(logp - old[micro])
                pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high))
                pg = torch.where(a < 0, torch.minimum(pg, -a * algo.dual_clip), pg)
                d = (ref[micro] - logp).clamp(-5, 5)
                kl = (d.exp() - d - 1).clamp(-10, 10)
                loss = (pg * m).sum() / m.sum() + algo.kl_coef * (kl * pm * m).sum() / m.sum()
                (loss / len(micros)).backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), o.grad_clip)
            opt.step()
        calls += 1  # the scheduler steps once per update_actor call
    return calls


class _Record:
    """Keeps each rollout step's experience (the rollout callback attaches it before the step)."""

    def __init__(self):
        from lightning.pytorch import Callback

        outer = self

        class CB(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                outer.steps.append(batch.experience)

        self.steps = []
        self.callback = CB()


def _make(tok, eta: float, steps: int):
    official = run_config(compose_train("fidelity=official"))
    algo = AlgorithmConfig(ar_alpha=0.3, kl_coef=0.05, token_mean_scope=official.algorithm.token_mean_scope,
                           lopti=LoptiConfig(enabled=True, eta=eta, empty_phase=official.algorithm.lopti.empty_phase))
    # Adam's eps at 1e-6: with the default 1e-8 a gradient element that is 0 up to rounding (~1e-11)
    # moves by lr * noise / eps, which would swamp the comparison without meaning anything
    optim = OptimConfig(lr=1e-3, eps=1e-6, weight_decay=0.1, lr_schedule=official.optim.lr_schedule,
                        scheduler_interval=official.optim.scheduler_interval)
    cfg = RunConfig(algorithm=algo, optim=optim, sizes=SizesConfig(**SIZES),
                    rollout=RolloutConfig(temperature=T, max_new_tokens=12))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=steps)
    module.rollout_engine = FixedEngine(tok)
    return module, algo, optim


def _split_eta(tok) -> float:
    """A threshold in a wide gap of the first rollout's p_old, tokens on both sides."""
    module, _, _ = _make(tok, 0.5, 1)
    rec = _Record()
    toy_trainer(callbacks=[rec.callback]).fit(module, datamodule=ToyDataModule(tokenizer=tok, prompts_per_step=2,
                                                                                max_prompt_length=256))
    ctx = module.last_step_context
    p = torch.exp(ctx.old_log_probs)[ctx.experience.response_mask.bool()].sort().values
    i = max(range(len(p) // 4, 3 * len(p) // 4), key=lambda j: (p[j + 1] - p[j]) / p[j])
    return float((p[i] + p[i + 1]) / 2)


@pytest.mark.parametrize("case", ["empty_low_phase", "split"])
def test_official_switches_replay_the_official_update(case, tiny_tokenizer):
    eta = 1e-12 if case == "empty_low_phase" else _split_eta(tiny_tokenizer)
    module, algo, optim = _make(tiny_tokenizer, eta, steps=2)
    hf0 = {k: v.detach().clone() for k, v in module.policy.hf.state_dict().items()}
    rec = _Record()
    dm = ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256)
    toy_trainer(callbacks=[rec.callback]).fit(module, datamodule=dm)
    assert len(rec.steps) == 2 and module.trainer.global_step == 8  # 2 steps x 2 phases x 2 mini-batches
    low_tokens = module.last_step_context.metrics["lopti/low_tokens"]
    assert (low_tokens == 0) == (case == "empty_low_phase")

    from arlopti.models.loading import build_tiny_model

    hf = build_tiny_model(tiny_tokenizer)
    hf.load_state_dict(hf0)
    ref_hf = build_tiny_model(tiny_tokenizer)
    ref_hf.load_state_dict(hf0)
    opt = torch.optim.AdamW(hf.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                            weight_decay=optim.weight_decay)
    calls = 0
    for step, exp in enumerate(rec.steps):
        before = {k: v.detach().clone() for k, v in hf.named_parameters()}
        calls = _official_rollout_step(hf, ref_hf, opt, exp, calls, algo, optim)
        if step == 0 and case == "empty_low_phase":
            # the first call (the empty low phase) ran at lr 0: Adam's step count advanced anyway
            assert all(opt.state[p]["step"] == 4 for p in hf.parameters())
        assert any(not torch.equal(v, before[k]) for k, v in hf.named_parameters())
    ours = dict(module.policy.hf.named_parameters())
    worst = max(float((ours[k].detach() - v.detach()).abs().max()) for k, v in hf.named_parameters())
    print(f"{case}: largest parameter difference to the official update {worst:.2e}")
    assert worst < 2e-6, f"largest parameter difference to the official update: {worst:.2e}"


def test_the_improved_defaults_differ_from_the_official_update(tiny_tokenizer):
    """The replay can fail: with fidelity=improved's switches the same rollouts give other weights."""
    module, algo, optim = _make(tiny_tokenizer, 1e-12, steps=1)
    module.cfg.algorithm.lopti.empty_phase = "skip"
    module.cfg.optim.lr_schedule = "linear_warmup"
    hf0 = {k: v.detach().clone() for k, v in module.policy.hf.state_dict().items()}
    rec = _Record()
    toy_trainer(callbacks=[rec.callback]).fit(
        module, datamodule=ToyDataModule(tokenizer=tiny_tokenizer, prompts_per_step=2, max_prompt_length=256))
    assert module.trainer.global_step == 2  # the empty phase took no step

    from arlopti.models.loading import build_tiny_model

    hf, ref_hf = build_tiny_model(tiny_tokenizer), build_tiny_model(tiny_tokenizer)
    hf.load_state_dict(hf0)
    ref_hf.load_state_dict(hf0)
    opt = torch.optim.AdamW(hf.parameters(), lr=optim.lr, eps=optim.eps, weight_decay=optim.weight_decay)
    _official_rollout_step(hf, ref_hf, opt, rec.steps[0], 0, algo, optim)
    ours = dict(module.policy.hf.named_parameters())
    worst = max(float((ours[k].detach() - v.detach()).abs().max()) for k, v in hf.named_parameters())
    print(f"improved vs official: largest parameter difference {worst:.2e}")
    assert worst > 1e-4
