"""The study's first-step mechanism on the tiny model: ``compare-methods`` on each seed's first batch.

For seed ``s``: the tiny model as every run of seed ``s`` starts (``model.tiny.seed = s``, then the seed's
warm start from the study's cache) and the batch every such run trains on at its first rollout step: the
one its GRPO run recorded (``runs/grpo/seed<s>/first_batch.pt``, :class:`arlopti.study.toy_run.StepRecorder`:
the experience the training loop's rollout callback made, so the same prompts, samples and rewards). On
it, :func:`arlopti.analysis.compare_methods.compare_methods` measures each method's first update from
those weights: the multiplier c_t per bucket, the gradient-mass share Σ|c·A|(1 − p), the share of
the first step's gradient ⟨g_b, g⟩/‖g‖², and after the update the Fig. 3 fractions and the mean Δp
by sign of A. The optimizer is the runs' (AdamW at their learning rate, a fresh state, one step
per phase), so the update is the runs' first step on one mini-batch holding the whole batch.

Each method is measured with its own settings (its experiment file's token-method fields, AR's α,
Lopti's η: :func:`shared_settings`), all in one ``compare-methods`` call, so methods whose first step is
the same are computed once. A method that ``compare-methods`` does not know is listed under
``not_measured``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from arlopti.config import AlgorithmConfig, TokenMethodConfig

#: What the study keeps of a compare-methods entry, each a dict per bucket.
MECHANISM_KEYS = ("effective_weight", "mass_share", "norm_share", "bucket_grad_norm", "pos_frac", "neg_frac",
                  "delta_p_pos_mean", "delta_p_neg_mean")
#: The counts behind the fractions (:mod:`arlopti.analysis.direction_counts`), kept beside them: k of each
#: fraction per bucket, and against GRPO the discordant tokens and the responses that moved more / fewer.
COUNT_KEYS = ("pos_rose", "neg_fell", "vs_grpo")


def first_batch(seed: int, sizes, tokenizer, run_folder: Path, warm_cache=None):
    """``(policy, AnalysisBatch)``: seed ``s``'s initial tiny model (warm-started as the runs are) and the first
    rollout batch its run recorded in ``run_folder`` (module docstring), with GRPO advantages."""
    import torch

    from arlopti.algorithms import grpo_advantages
    from arlopti.analysis.inputs import AnalysisBatch
    from arlopti.config import ModelConfig, TinyModelConfig
    from arlopti.learner.policy import PolicyLM, disable_dropout
    from arlopti.models.loading import load_causal_lm
    from arlopti.study.toy_run import initial_weights

    cfg = ModelConfig(name_or_path="tiny", tiny=TinyModelConfig(seed=seed))  # model=tiny, as the runs load it
    model = load_causal_lm(cfg.name_or_path, tokenizer, dtype="float32", tiny=cfg.tiny)
    disable_dropout(model)
    policy = PolicyLM(model, cfg.logprob_impl)
    initial_weights(policy, tokenizer, seed, sizes.warm_start_steps, sizes.warm_start_lr, warm_cache)
    b = torch.load(Path(run_folder) / "first_batch.pt", weights_only=False)
    batch = AnalysisBatch(b["input_ids"], b["attention_mask"], b["response_mask"], b["prompt_len"], b["rewards"],
                          b["group_ids"], grpo_advantages(b["rewards"], b["group_ids"]), "grpo", sizes.temperature,
                          b["response_texts"])
    return policy, batch


def shared_settings(algos: dict[str, AlgorithmConfig]) -> tuple[float, float, TokenMethodConfig]:
    """``(alpha, eta, token_cfg)`` for one ``compare-methods`` call over all ``algos``: AR's α of the
    methods with AR, Lopti's η of those with Lopti (none: ``algorithm=ar_lopti``'s,
    :func:`arlopti.analysis.cli_args.paper_settings`), and every method's own token-method fields (each
    experiment file sets only its method's fields). Two methods disagreeing on one of them is an error."""
    from arlopti.analysis.cli_args import paper_settings

    def one(values: set, what: str, default: float) -> float:
        if len(values) > 1:
            raise ValueError(f"the methods set different {what} {sorted(values)}: study them in separate runs")
        return values.pop() if values else default

    paper_alpha, paper_eta = paper_settings()
    alpha = one({a.ar_alpha for a in algos.values() if a.ar_alpha > 0}, "AR alphas", paper_alpha)
    eta = one({a.lopti.eta for a in algos.values() if a.lopti.enabled}, "Lopti etas", paper_eta)
    default, merged = asdict(TokenMethodConfig()), {}
    for name, a in algos.items():
        for key, value in asdict(a.token_method).items():
            if key != "name" and value != default[key]:
                if key in merged and merged[key] != value:
                    raise ValueError(f"kk_{name} sets token_method.{key}={value}, another method {merged[key]}")
                merged[key] = value
    return alpha, eta, TokenMethodConfig(**{**default, **merged})


def mechanism_entry(entry: dict) -> dict:
    """The per-bucket numbers the study keeps of one ``compare-methods`` entry, and its counts (GRPO has no
    ``vs_grpo``)."""
    return {**{k: entry[k] for k in MECHANISM_KEYS}, **{k: entry[k] for k in COUNT_KEYS if k in entry}}


def seed_mechanism(seed: int, algos: dict[str, AlgorithmConfig], sizes, tokenizer, run_folder: Path,
                   warm_cache=None) -> dict:
    """``{"batch", "tokens_per_bucket", "support", "methods": {method: per-bucket numbers and counts},
    "not_measured"}`` of one
    seed, on the first batch of the run in ``run_folder``: one ``compare-methods`` call
    (:func:`shared_settings`) over the methods it knows."""
    from arlopti.analysis.compare_methods import KNOWN_METHODS, compare_methods

    policy, batch = first_batch(seed, sizes, tokenizer, run_folder, warm_cache)
    known = {m: a for m, a in algos.items() if m in KNOWN_METHODS}
    alpha, eta, token_cfg = shared_settings(known)
    r = compare_methods(policy, batch, tuple(known), alpha, eta, "adamw", sizes.lr,
                        micro_batch_size=sizes.mini_batch_size, token_cfg=token_cfg)
    return {"batch": {k: v for k, v in batch.summary().items() if k != "model_info"},
            "tokens_per_bucket": r["tokens_per_bucket"], "support": r["support"],
            "methods": {m: mechanism_entry(e) for m, e in r["methods"].items()},
            "not_measured": [m for m in algos if m not in KNOWN_METHODS]}
