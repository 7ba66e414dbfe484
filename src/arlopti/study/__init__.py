"""The seeded method study (``arlopti study <part>``): every token-level method against GRPO over seeds,
in a controlled setting (the tiny model, ``toy``) and the paper's at CPU scale (SmolLM2 on K&K, ``kk-*``).

It stands above everything else: its runs are training runs through :func:`arlopti.run` (the training
loop's own rollout callback and learner) and evaluations through ``eval.py``'s job, its first-step
measurements are :mod:`arlopti.analysis`'s, and nothing of the package imports it.

Read first: :mod:`arlopti.study.__main__` (the parts and their options), then :mod:`arlopti.study.toy`.
"""
