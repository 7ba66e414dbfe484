"""The non-finite step guard: skip a step whose loss or gradient norm is not finite, abort after
``algorithm.max_consecutive_skips`` such steps in a row. Its counters are saved in checkpoints."""

from __future__ import annotations


class NonFiniteAbort(RuntimeError):
    pass


class NonFiniteGuard:
    def __init__(self, max_consecutive: int):
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0

    def allow(self, finite: bool, *, loss: float, grad_norm: float, rollout_step: int) -> bool:
        """True: take the step. False: skip it (counted). Raises :class:`NonFiniteAbort` after
        ``max_consecutive`` skips in a row. ``finite`` must already agree over ranks."""
        if finite:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.total += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteAbort(
                f"{self.consecutive} consecutive optimizer steps had a non-finite loss or gradient "
                f"(last loss={loss}, grad_norm={grad_norm}) at rollout step {rollout_step}. "
                "Lower optim.lr, check the reward and the data, or raise algorithm.max_consecutive_skips.")
        return False

    def state_dict(self) -> dict:
        return {"total_skips": self.total, "consecutive_skips": self.consecutive}

    def load_state_dict(self, state: dict) -> None:
        self.total = int(state.get("total_skips", 0))
        self.consecutive = int(state.get("consecutive_skips", 0))
