"""Token-budget micro-batches: pack one mini-batch's rows under a padded-token budget.

The learner pads each micro-batch to ``prompt_len + longest response in it``
(:meth:`arlopti.learner.experience.Experience.select` trims the rest), so a micro-batch of rows
``S`` costs

    cost(S) = |S| · (P + max_{i∈S} r_i)          (padded tokens the forward really computes)

with ``P`` the batch's padded prompt length and ``r_i ≥ 1`` the response lengths (an empty
response still costs one position, as ``select`` keeps at least one column).

:func:`plan_micro_batches` splits rows into micro-batches with ``cost ≤ budget``:

1. sort the rows by response length, longest first (ties by row order), so that every
   micro-batch is a run of similar lengths and pads little;
2. ``k`` = :func:`min_micro_batches`, the fewest runs of that order that fit the budget (greedy:
   a run grows while it fits). A single row whose cost alone exceeds the budget gets a
   micro-batch of its own (reported in ``MicroBatchPlan.oversized``);
3. balance: the oversized rows keep their own micro-batches; the other rows are split, in the
   sorted order, into the remaining runs so that the largest cost is as small as possible
   (:func:`balanced_partition`; exact, by bisection on the maximum). Every micro-batch without
   an oversized row therefore fits the budget.

Why runs of the sorted order and not a Karmarkar–Karp partition (verl's
``get_seqlen_balanced_partitions``): KK balances the *sums* of lengths, which is the cost of a
padding-free (unpadded, varlen) forward; with padded forwards it mixes long and short rows and
pads every micro-batch to the long one. Splitting the sorted order is the padded-cost analogue
of the same idea — fewest micro-batches that fit, then the most even ones — and keeps padding
to the within-run length spread.

``k`` may be raised by the caller (``k=`` argument): under DDP/FSDP every rank must run the same
number of forward/backward passes (each backward is a gradient collective), so the learner
all-reduces the max of the ranks' ``k`` first. ``k`` can never exceed the row count there,
because every rank holds the same number of rows.

Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatchPlan:
    """Micro-batches as lists of positions into the ``lengths`` given to :func:`plan_micro_batches`.

    ``micro_batches`` are ordered longest first; each lists its positions in increasing order.
    ``padded_tokens`` = Σ cost over micro-batches; ``oversized`` = positions whose own cost
    exceeds the budget (each is alone in its micro-batch).
    """

    micro_batches: list[list[int]]
    padded_tokens: int
    oversized: list[int]


def micro_batch_cost(lengths: Sequence[int], prompt_len: int) -> int:
    """``len(lengths) · (prompt_len + max(max(lengths), 1))``; 0 for no rows."""
    if not lengths:
        return 0
    return len(lengths) * (prompt_len + max(max(lengths), 1))


def _sorted_order(lengths: Sequence[int]) -> list[int]:
    """Positions sorted by length, longest first, ties by position (deterministic)."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def _greedy_runs(sorted_lengths: Sequence[int], prompt_len: int, cap: int) -> list[tuple[int, int]]:
    """Split a descending length list into maximal runs ``[lo, hi)`` of cost ``≤ cap``.

    In descending order a run's longest row is its first, so its cost is ``(hi − lo) · (P +
    r_lo)``. A row that alone exceeds ``cap`` forms a run by itself.
    """
    runs, lo, n = [], 0, len(sorted_lengths)
    while lo < n:
        width = prompt_len + max(sorted_lengths[lo], 1)
        hi = lo + max(1, cap // width)
        hi = min(hi, n)
        runs.append((lo, hi))
        lo = hi
    return runs


def min_micro_batches(lengths: Sequence[int], prompt_len: int, budget: int) -> int:
    """Fewest micro-batches of the longest-first order with cost ``≤ budget`` (oversized rows alone).

    Greedy is optimal here: with the order fixed, taking as many rows as fit into each run can
    only leave fewer rows for the rest.
    """
    _check(lengths, prompt_len, budget)
    return len(_greedy_runs([lengths[i] for i in _sorted_order(lengths)], prompt_len, budget))


def balanced_partition(lengths: Sequence[int], prompt_len: int, k: int) -> list[list[int]]:
    """Split the longest-first order into exactly ``k`` non-empty runs minimising the max cost.

    Bisection on the cap ``C``: the greedy split with cap ``C`` needs ``g(C)`` runs, ``g`` is
    non-increasing, and any split into ``g(C) ≤ k`` runs can be refined to exactly ``k`` runs
    without raising the max (a sub-run never costs more than its run). The smallest ``C`` with
    ``g(C) ≤ k`` is therefore the optimal max cost. Returns lists of positions, longest run
    first, positions increasing within a run.
    """
    n = len(lengths)
    if not 1 <= k <= max(n, 1):
        raise ValueError(f"balanced_partition: k={k} must lie in [1, {n}] (one row per micro-batch at most)")
    if n == 0:
        return [[]]
    order = _sorted_order(lengths)
    sl = [lengths[i] for i in order]
    lo = max(prompt_len + max(r, 1) for r in sl)  # a cap below one row's cost is infeasible
    hi = micro_batch_cost(sl, prompt_len)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy_runs(sl, prompt_len, mid)) <= k:
            hi = mid
        else:
            lo = mid + 1
    runs = _greedy_runs(sl, prompt_len, lo)
    while len(runs) < k:  # refine: split the costliest splittable run where its halves balance best
        j = max((i for i, (a, b) in enumerate(runs) if b - a > 1),
                key=lambda i: (micro_batch_cost(sl[runs[i][0]:runs[i][1]], prompt_len), -i))
        a, b = runs[j]
        cut = min(range(a + 1, b), key=lambda c: (max(micro_batch_cost(sl[a:c], prompt_len),
                                                       micro_batch_cost(sl[c:b], prompt_len)), c))
        runs[j:j + 1] = [(a, cut), (cut, b)]
    return [sorted(order[a:b]) for a, b in runs]


def plan_micro_batches(lengths: Sequence[int], prompt_len: int, budget: int, k: int | None = None) -> MicroBatchPlan:
    """Token-budget micro-batches of one mini-batch (module docstring).

    ``lengths``: response lengths of the rows; ``prompt_len``: the padded prompt length P;
    ``budget``: ``sizes.micro_batch_tokens``; ``k``: force this many micro-batches (must be at
    least :func:`min_micro_batches` and at most ``len(lengths)``), e.g. the max over ranks.
    """
    _check(lengths, prompt_len, budget)
    need = min_micro_batches(lengths, prompt_len, budget)
    if k is None:
        k = need
    if not need <= k <= max(len(lengths), 1):
        raise ValueError(f"plan_micro_batches: k={k} micro-batches for {len(lengths)} rows under "
                         f"sizes.micro_batch_tokens={budget}: need between {need} and {len(lengths)}")
    # Oversized rows (the longest ones) each get their own micro-batch; the others are balanced
    # among the remaining k - m micro-batches, so none of those exceeds the budget.
    oversized = [i for i in _sorted_order(lengths) if prompt_len + max(lengths[i], 1) > budget]
    alone = set(oversized)
    rest = [i for i in range(len(lengths)) if i not in alone]
    parts = [[i] for i in oversized]
    if rest:
        sub = balanced_partition([lengths[i] for i in rest], prompt_len, k - len(oversized))
        parts += [[rest[j] for j in p] for p in sub]
    padded = sum(micro_batch_cost([lengths[i] for i in p], prompt_len) for p in parts)
    return MicroBatchPlan(parts, padded, sorted(oversized))


def fixed_micro_batches(n_rows: int, size: int) -> list[list[int]]:
    """``sizes.micro_batch_size`` chunks of positions ``0 .. n_rows − 1``, in order."""
    if size < 1:
        raise ValueError(f"sizes.micro_batch_size={size} must be >= 1")
    return [list(range(i, min(i + size, n_rows))) for i in range(0, n_rows, size)]


def _check(lengths: Sequence[int], prompt_len: int, budget: int) -> None:
    if budget <= 0:
        raise ValueError(f"sizes.micro_batch_tokens={budget} must be > 0")
    if prompt_len < 0:
        raise ValueError(f"prompt_len={prompt_len} must be >= 0")
    if any(r < 0 for r in lengths):
        raise ValueError("response lengths must be >= 0")


def mini_batches(n_rows: int, per_rank: int) -> list[list[int]]:
    """This rank's mini-batches: rows ``0 … n_rows-1`` in order, ``per_rank`` at a time."""
    rows = list(range(n_rows))
    return [rows[i:i + per_rank] for i in range(0, n_rows, per_rank)]


def micro_batches_of(rows: list[int], experience, size: int, budget: int | None,
                     max_over_ranks=lambda k: k) -> tuple[list[list[int]], str | None]:
    """Micro-batches (lists of indices into ``experience``) of mini-batch ``rows``, and a warning when
    some sequence alone is over the token budget.

    ``budget`` unset: ``size`` rows at a time, in order. Set: :func:`plan_micro_batches` on the
    rows' response lengths, the number of micro-batches raised to ``max_over_ranks`` of this rank's
    minimum (every rank must run as many backwards: each is a gradient collective).
    """
    if budget is None:
        return [[rows[j] for j in mb] for mb in fixed_micro_batches(len(rows), size)], None
    lengths = [int(x) for x in experience.response_lengths[rows].tolist()]
    k = max_over_ranks(min_micro_batches(lengths, experience.prompt_len, budget))
    plan = plan_micro_batches(lengths, experience.prompt_len, budget, k=k)
    warning = None
    if plan.oversized:
        longest = max(lengths[i] for i in plan.oversized)
        warning = (f"sizes.micro_batch_tokens={budget} is below the cost of {len(plan.oversized)} single "
                   f"sequence(s) (prompt {experience.prompt_len} + response up to {longest} tokens): each gets a "
                   f"micro-batch of its own. Raise the budget to at least {experience.prompt_len + longest} to bound "
                   "the memory of every micro-batch")
    return [[rows[j] for j in mb] for mb in plan.micro_batches], warning
