"""Run names that say what ran: ``logs/<task_name>/<run_name>/<time>``.

``run_name`` (configs/train.yaml) is ``${run_label:${algorithm},${oc.select:model.lora.r,0},${seed}}``,
the parts of the algorithm that differ from GRPO's defaults (``arlopti.config.AlgorithmConfig``),
joined by ``_``, then the seed:

* the estimator when not ``grpo`` (``rloo``, ``drgrpo``, ``reinforce_pp``, ...), the policy loss when
  not ``ppo_clip`` (``gspo``, ``cispo``), the aggregation when not ``token-mean``, the token method
  when not ``none`` (``clip_cov``, ...), ``dapo`` when any DAPO piece is on;
* AR's α (``a0.3``), Lopti's η (``e0.5``), the LoRA rank (``r16``) when ``model.lora.r`` > 0;
* ``x`` + 6 hex digits: a digest of every other algorithm setting that differs from the default
  (clip bounds, KL, ``fidelity=official``'s ``token_mean_scope``, ...), so that two runs of the same
  ``task_name`` with different algorithms never share a run folder;
* ``s<seed>``.

E.g. ``kk_ar_lopti/a0.3_e0.5_s42/<time>``; ``experiment=kk_grpo algorithm.advantage=rloo`` is
``kk_grpo/rloo_s42`` beside plain GRPO's ``kk_grpo/s42``. ``debug=smoke`` adds ``_smoke``.
Importing :mod:`arlopti.config` registers the resolver (:mod:`arlopti.config.resolvers`), so configs
compose anywhere the package is imported (train.py, eval.py, tests).
"""

from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

#: The keys named in clear (the rest of the algorithm config, when not default, is digested).
NAMED = ("advantage", "policy_loss", "loss_agg", "token_method.name", "ar_alpha", "lopti.enabled", "lopti.eta")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def _defaults() -> dict:
    from dataclasses import asdict

    from arlopti.config import AlgorithmConfig

    return _flat(json.loads(json.dumps(asdict(AlgorithmConfig()), default=list)))


def algorithm_parts(algorithm: dict) -> list[str]:
    """The named parts and the digest of ``algorithm`` (a resolved ``algorithm`` config; module docstring)."""
    flat, default = _flat(algorithm), _defaults()
    parts = [str(flat[k]) for k, d in (("advantage", "grpo"), ("policy_loss", "ppo_clip"), ("loss_agg", "token-mean"),
                                        ("token_method.name", "none")) if k in flat and flat[k] != d]
    if any(v is True for k, v in flat.items() if k.startswith("dapo.")):
        parts.append("dapo")
    if float(flat.get("ar_alpha") or 0) > 0:
        parts.append(f"a{float(flat['ar_alpha']):g}")
    if str(flat.get("lopti.enabled")).lower() == "true":
        parts.append(f"e{float(flat['lopti.eta']):g}")
    rest = {k: v for k, v in flat.items() if k not in NAMED and not (k.startswith("dapo.") and isinstance(v, bool))
            and json.dumps(v, default=str) != json.dumps(default.get(k), default=str)}
    if rest:
        parts.append("x" + hashlib.sha1(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:6])
    return parts


def run_label(algorithm, lora_r=0, seed=42) -> str:
    """``run_name`` without its suffix (module docstring)."""
    if isinstance(algorithm, DictConfig):
        algorithm = OmegaConf.to_container(algorithm, resolve=True)
    parts = algorithm_parts(dict(algorithm or {}))
    if lora_r and int(lora_r) > 0:
        parts.append(f"r{int(lora_r)}")
    parts.append(f"s{seed}")
    return "_".join(parts)

