"""Custom autograd kernels: memory-bound operations with a hand-written backward.

:mod:`arlopti.ops.logprobs`: the fused, tiled per-token log-prob and entropy of an LM head
(``token_logprobs``), through which every log-prob of the project goes. The maths they implement
is stated in each module; the objective's maths lives in :mod:`arlopti.algorithms`.

Read first: :mod:`arlopti.ops.logprobs`.
"""
