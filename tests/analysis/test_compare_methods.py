"""``compare-methods`` on the tiny model (CI) and on SmolLM2 (slow): files, the documented identities,
and that its first-step gradient of each token method is grpo_objective's gradient with that method."""

from __future__ import annotations

import json

import pytest
import torch

from arlopti.analysis.__main__ import main

TINY = ["--model", "tiny", "--cold-start-steps", "0", "--prompts", "2", "--group-size", "2",
        "--max-new-tokens", "6", "--threads", "1"]


def test_compare_methods_writes_png_and_json_with_every_method(tmp_path):
    from arlopti.analysis.compare_methods import METHODS

    main(["compare-methods", *TINY, "--out", str(tmp_path)])
    data = json.loads((tmp_path / "compare_methods_sgd.json").read_text())
    assert (tmp_path / "compare_methods_sgd.png").stat().st_size > 1000
    assert list(data["methods"]) == list(METHODS) and "SYNTHETIC" in data["caption"]
    m = data["methods"]
    for name, r in m.items():
        shares = [v for v in r["norm_share"].values() if v is not None]
        assert sum(shares) == pytest.approx(1.0, abs=1e-6), name
        assert sum(v for v in r["mass_share"].values() if v is not None) == pytest.approx(1.0, abs=1e-6), name
    # GRPO's multiplier is 1; Archer and KL-Cov change nothing on a first step from θ (module docstring)
    assert all(v in (None, 1.0) for v in m["grpo"]["effective_weight"].values())
    for name in ("archer", "kl_cov"):
        assert m[name]["pos_frac"] == m["grpo"]["pos_frac"] and m[name]["grad_norms"] == m["grpo"]["grad_norms"]


@pytest.mark.parametrize("method", ["clip_cov", "top_entropy", "tr_grpo", "reverse", "archer", "kl_cov"])
def test_first_step_gradient_equals_grpo_objective_with_the_method(method):
    """At θ the analysis's spec (GRPO with A' = c·A) gives grpo_objective-with-the-method's gradient."""
    from arlopti.algorithms import LossScale, grpo_objective
    from arlopti.analysis.__main__ import build_parser
    from arlopti.analysis.commands import load_inputs
    from arlopti.analysis.compare_methods import method_plan, sampled_entropy
    from arlopti.analysis.updates import LossSpec, loss_gradients, trainable
    from arlopti.config import AlgorithmConfig, TokenMethodConfig
    from arlopti.plugins.shaping import Forward, shaping_for

    args = build_parser().parse_args(["compare-methods", *TINY])
    loaded, batch, old = load_inputs(args)
    policy, mask = loaded.policy, batch.response_mask
    ent = sampled_entropy(policy, batch)
    tcfg = TokenMethodConfig(name=method, cov_ratio=0.2, entropy_top=0.5)
    _, adv_eff, _ = method_plan(method, old, ent, batch.advantages, mask, 0.3, 0.5, tcfg)
    spec = loss_gradients(policy, batch, old, {"m": LossSpec(adv_eff, mask)}, micro_batch_size=len(batch))["m"]
    policy.eval()
    r = int(mask.sum(-1).max())
    ids, attn = batch.input_ids[:, :batch.prompt_len + r], batch.attention_mask[:, :batch.prompt_len + r]
    logp, e = policy(ids, attn, batch.prompt_len, batch.temperature, with_entropy=True)
    algo = AlgorithmConfig(kl_coef=0.0, entropy_coef=0.0, token_method=tcfg)
    o, adv, m = old[:, :r], batch.advantages[:, :r], mask[:, :r]
    shaping = shaping_for(algo, logp, o, adv, m, m, Forward(e.detach()))
    loss, _ = grpo_objective(logp, o, adv, m, m, algo, entropy=e.detach(), scale=LossScale(float(mask.sum())),
                             shaping=shaping)
    direct = torch.autograd.grad(loss, trainable(policy), allow_unused=True)
    for a, b in zip(spec, direct):
        assert torch.allclose(a, torch.zeros_like(a) if b is None else b.float(), atol=1e-6)


@pytest.mark.slow
def test_compare_methods_on_smollm2(smollm2_path, tmp_path):
    # one prompt, two methods: every method's numbers are checked on the tiny model above; here the real
    # model's probabilities (one backward per bucket and method, ~9 s each at two prompts)
    main(["compare-methods", "--cold-start-steps", "0", "--prompts", "1", "--group-size", "2", "--max-new-tokens",
          "24", "--out", str(tmp_path), "--methods", "ar,tr_grpo"])
    data = json.loads((tmp_path / "compare_methods_sgd.json").read_text())
    high = "0.75-1.00"
    # exact ranges of the multipliers above p = .75: AR 0.3 p + 0.7 in (0.925, 1]; TR-GRPO 4 (sigmoid(p) - .5) in
    # (0.717, 0.924] (p_old = p at θ)
    assert 0.925 <= data["methods"]["ar"]["effective_weight"][high] <= 1.0
    assert 0.716 <= data["methods"]["tr_grpo"]["effective_weight"][high] <= 0.925
