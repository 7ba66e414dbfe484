"""The learner: ``GRPOModule``, the LightningModule with manual optimisation that turns a rollout step's
experience into GRPO / AR / Lopti updates, with its targets, micro-batches, metrics and checkpoint state.

Read first: :mod:`arlopti.learner.module` (one training step, phase by phase), then
:mod:`arlopti.learner.advantages` (each pass's masks and advantages).
"""
