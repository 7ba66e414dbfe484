"""A callback that sends this process a signal when a rollout step starts, as Ctrl-C or a scheduler would."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as L


class SendSignal(L.Callback):
    """``os.kill(self, <signal>)`` at the start of rollout step ``at_step`` (1-based)."""

    def __init__(self, at_step: int = 1, signal_name: str = "SIGINT"):
        self.at_step, self.signal = int(at_step), getattr(signal, signal_name)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.rollout_step + 1 == self.at_step:
            os.kill(os.getpid(), self.signal)
