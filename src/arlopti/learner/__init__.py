"""The learner: ``GRPOModule``, the LightningModule with manual optimisation that turns a rollout step's
experience into GRPO / AR / Lopti updates, with its micro-batches, metrics and checkpoint state.

Read first: :mod:`arlopti.learner.module` (one training step, phase by phase; docs/learner.md in prose),
then :mod:`arlopti.algorithms.inputs` (each token's p_old, advantage and phase) and
:mod:`arlopti.algorithms.objective` (the loss).
"""
