"""Run names that say what ran: ``logs/<task_name>/<run_name>/<time>``.

``run_name`` (configs/train.yaml) is ``${run_label:…}``: AR's α (``a0.3``), Lopti's η
(``e0.5``) and the seed (``s42``), joined by ``_``, e.g. ``kk_ar_lopti/a0.3_e0.5_s42/<time>``;
GRPO is ``s42`` alone. Importing :mod:`arlopti` registers the resolver, so configs compose
anywhere the package is imported (train.py, eval.py, tests).
"""

from __future__ import annotations

from omegaconf import OmegaConf


def run_label(ar_alpha, lopti_enabled, eta, seed) -> str:
    parts = []
    if ar_alpha and float(ar_alpha) > 0:
        parts.append(f"a{float(ar_alpha):g}")
    if str(lopti_enabled).lower() == "true":
        parts.append(f"e{float(eta):g}")
    parts.append(f"s{seed}")
    return "_".join(parts)


def register() -> None:
    if not OmegaConf.has_resolver("run_label"):
        OmegaConf.register_new_resolver("run_label", run_label)


register()
