"""``ColdStartCallback``: the SFT cold start (:mod:`arlopti.learner.cold_start`) before the first
GRPO step of a fresh run.

Its arguments are the fields of :class:`~arlopti.learner.cold_start.ColdStartConfig`. On
``on_fit_start`` of a run that has not started (``rollout_step == 0``, and not already done per
its restored state) it runs the warm-up under the trainer's precision context, logs
``cold_start/loss`` on global rank 0, resets the reference model to the warmed-up policy, bumps
the weight version (so the rollout engine syncs) and keeps the losses on
``pl_module.cold_start_losses`` for the run summary. Its state (done, losses) is saved with the
checkpoint, so a resumed run does not warm up again.
"""

from __future__ import annotations

import time

import lightning.pytorch as L

from arlopti.learner.cold_start import ColdStartConfig, run_cold_start


class ColdStartCallback(L.Callback):
    """Runs :func:`~arlopti.learner.cold_start.run_cold_start` once, at the start of a fresh run (not on resume)."""

    def __init__(self, **kwargs):
        self.cfg = ColdStartConfig(**kwargs)
        self.done = False
        self.losses: list[float] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        if not self.cfg.enabled or self.done or pl_module.rollout_step > 0:
            return
        loggers = trainer.loggers if trainer.global_rank == 0 else []

        def log_fn(metrics, step):
            for lg in loggers:
                lg.log_metrics(metrics, step=step)

        t0 = time.perf_counter()
        with trainer.precision_plugin.forward_context():
            self.losses = run_cold_start(pl_module.policy, pl_module.tokenizer, self.cfg, log_fn)
        pl_module.cold_start_seconds = time.perf_counter() - t0  # the run summary's "cold start" phase
        if pl_module.ref is not None:  # anchor the KL to the warmed-up policy
            pl_module.ref.load_state_dict(pl_module.policy.state_dict())
        pl_module.weight_version += 1
        pl_module.cold_start_losses = self.losses
        self.done = True

    def state_dict(self) -> dict:
        return {"done": self.done, "losses": self.losses}

    def load_state_dict(self, state: dict) -> None:
        self.done = bool(state.get("done", False))
        self.losses = list(state.get("losses", []))
