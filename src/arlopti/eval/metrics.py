"""avg@k and pass@k over per-sample correctness grouped by problem.

Input to both metrics: a ``[num_problems, n]`` tensor of per-sample correctness (bool or 0/1),
one row per problem with its ``n`` samples (use :func:`group_by_uid` to build it from flat
lists). States are sums, reduced by summation across processes.

* ``avg@k`` (:class:`AvgAtK`) = mean correctness over all samples = pass@1 averaged over the
  k samples; AR-Lopti's ``<bench>-avg@16``.
* ``pass@k`` (:class:`PassAtK`) = fraction of problems with at least one correct sample among
  k. With exactly k samples per problem that is the plain indicator (AR-Lopti's ``pass@16``);
  with n > k samples it is the unbiased estimator :func:`pass_at_k` of Chen et al. (2021),
  averaged over problems.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torchmetrics import Metric


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``.

    Requires ``0 <= c <= n`` and ``1 <= k <= n``. Computed as a product (no big binomials).
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def group_by_uid(uids: Sequence[Any], correct: Sequence[Any]) -> torch.Tensor:
    """``[num_problems, n]`` correctness from flat per-sample lists, problems in first-seen order.

    Raises ValueError if the lengths differ or problems have different sample counts.
    """
    if len(uids) != len(correct):
        raise ValueError(f"{len(uids)} uids but {len(correct)} correctness values")
    groups: dict[Any, list[float]] = {}
    for uid, ok in zip(uids, correct):
        groups.setdefault(uid, []).append(float(bool(ok)))
    sizes = {len(v) for v in groups.values()}
    if len(sizes) > 1:
        raise ValueError(f"problems have different sample counts {sorted(sizes)}; "
                         "every problem needs the same n samples")
    if not groups:
        return torch.zeros(0, 0)
    return torch.tensor(list(groups.values()), dtype=torch.float32)


def _as_matrix(correct: torch.Tensor | Sequence, k: int | None, exact: bool) -> torch.Tensor:
    x = torch.as_tensor(correct).to(torch.float64)
    if x.dim() != 2:
        raise ValueError(f"expected a [num_problems, samples] correctness tensor, got shape {tuple(x.shape)}")
    if k is not None and x.shape[0] and (x.shape[1] != k if exact else x.shape[1] < k):
        need = f"exactly {k}" if exact else f"at least {k}"
        raise ValueError(f"each problem needs {need} samples, got {x.shape[1]}")
    return x


class AvgAtK(Metric):
    """avg@k: the mean of per-sample correctness over all problems x k samples.

    ``k`` (optional) is checked against the number of samples per problem.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, k: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.k = k
        self.add_state("correct", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("samples", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: torch.Tensor) -> None:
        x = _as_matrix(correct, self.k, exact=True)
        self.correct += x.sum()
        self.samples += x.numel()

    def compute(self) -> torch.Tensor:
        if self.samples == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.correct / self.samples


class PassAtK(Metric):
    """pass@k: the fraction of problems solved by at least one of k samples.

    Rows with more than k samples use the unbiased estimator :func:`pass_at_k`.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, k: int, **kwargs):
        super().__init__(**kwargs)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.add_state("passed", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("problems", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: torch.Tensor) -> None:
        x = _as_matrix(correct, self.k, exact=False)
        n = x.shape[1]
        counts = (x > 0).sum(dim=1).tolist()
        self.passed += sum(pass_at_k(n, int(c), self.k) for c in counts)
        self.problems += x.shape[0]

    def compute(self) -> torch.Tensor:
        if self.problems == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.passed / self.problems
