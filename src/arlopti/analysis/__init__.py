"""Research analyses above the training path: the paper's mechanism figures from a model or a rollout
dump (``arlopti analysis ...``). The study that runs methods over seeds is :mod:`arlopti.study`
(``arlopti analysis study ...`` is its old name, handed over by name).

Read first: :mod:`arlopti.analysis.commands` (every ``python -m arlopti.analysis`` command, one function
each).
"""
