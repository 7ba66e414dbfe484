"""Everything beyond the paper and its GRPO base, standing on :mod:`arlopti.algorithms`.

The core (``algorithms/``) is GRPO, AR and Lopti; it never imports this package. The options here
register into the core's registries (:mod:`arlopti.config.registries`) when this package is imported:
the rival policy losses (:mod:`.rival_losses`), the token methods (:mod:`.token_methods`), the
rollout-mismatch corrections (:mod:`.mismatch`), and the estimators beyond GRPO, Dr.GRPO and RLOO
(:mod:`.advantages`). What reaches the core's objective from them is one precomputed per-token
:class:`~arlopti.algorithms.objective.Shaping` (:mod:`.shaping`). The rest are the run's other
options and diagnostics: DAPO (:mod:`.dapo`, :mod:`.dynamic_sampling`), off-policy staleness
(:mod:`.staleness`), the p_old buckets (:mod:`.buckets`) and what a configuration needs from the
learner's forward passes (:mod:`.forward_needs`).
"""

import arlopti.algorithms  # noqa: F401  (the core registers first: the registries keep that order)
from arlopti.plugins import advantages, mismatch, rival_losses, token_methods  # noqa: F401  (register)
