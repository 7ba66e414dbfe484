"""Research analyses above the training path: the paper's mechanism figures, the live-diagnostic sums
the callbacks log, and the seeded method study (``arlopti analysis ...`` / ``arlopti study ...``).

Read first: :mod:`arlopti.analysis.commands` (every ``python -m arlopti.analysis`` command, one function
each), then :mod:`arlopti.analysis.study` for the study harness.
"""
