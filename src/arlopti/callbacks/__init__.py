"""Every Lightning callback of the project, one per module (the logic they call lives elsewhere).

* :mod:`~arlopti.callbacks.rollout`: the rollout of each training step (the learner brings it);
* :mod:`~arlopti.callbacks.checkpointing`: checkpoints on rollout steps, signals and a metric;
* :mod:`~arlopti.callbacks.benchmark_eval`: validation through the rollout engine (:mod:`arlopti.eval`);
* :mod:`~arlopti.callbacks.diagnostics`: token-probability diagnostics (:mod:`arlopti.learner.diagnostics`);
* :mod:`~arlopti.callbacks.rollout_dump`: rollout dumps (:mod:`arlopti.learner.rollout_dump`);
* :mod:`~arlopti.callbacks.cold_start`: the SFT cold start (:mod:`arlopti.learner.cold_start`);
* :mod:`~arlopti.callbacks.summary`: the run summary.

Read first: :mod:`~arlopti.callbacks.rollout` (collect, score, experience: one training step's data).
"""
