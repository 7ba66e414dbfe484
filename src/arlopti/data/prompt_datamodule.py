"""The shared machinery of every prompt DataModule: tokenise, filter, shard and resume.

A task's DataModule (K&K, math) subclasses :class:`PromptDataModule` and implements two
methods that return :class:`PromptRecord` lists: :meth:`train_records` and :meth:`val_records`.
This base class then

* renders and tokenises each record with the model's tokenizer;
* **filters** prompts longer than ``max_prompt_length`` (never truncates) and logs the count;
  validation sets use ``val_max_prompt_length`` when set (``fidelity=official``: 1,024, the
  official validation filter), else the same ``max_prompt_length``;
* yields :class:`~arlopti.prompts.batch.PromptBatch` objects of ``prompts_per_step`` prompts per
  optimizer-independent *rollout step*, sharded across data-parallel ranks (rank r takes a
  contiguous slice of the global batch, so whole prompts, and therefore whole GRPO groups,
  stay on one rank);
* shuffles deterministically from ``seed`` and the epoch, and records the consumed position
  so that a resumed run continues with the next unseen batch (``state_dict``);
* hands out the **extra prompts of DAPO's dynamic sampling** (:meth:`PromptDataModule.extra_batch`):
  round ``k >= 1`` of the rollout step whose main batch sits at ``position = (epoch, b)`` takes
  the ``k``-th block of ``prompts_per_step`` prompts of a permutation drawn from
  ``(seed, epoch, b)`` of the training prompts *other than that main batch* (all of them when
  fewer than ``prompts_per_step`` are left; the blocks wrap around when the rounds need more
  prompts than there are), rank ``r`` taking its contiguous ``P/W`` slice as for the main batch.
  The extra prompts are a pure function of the seed and the step's data position, which a
  checkpoint restores, so a resumed run draws the same ones; they do not advance the epoch
  (the main sampler alone does), so an epoch still visits every prompt once as a main prompt,
  and a prompt may come back later as an extra one (sampling with replacement across steps).

A validation set that the length filter empties is an error naming it, as an empty validation
file is. Validation/benchmark sets are exposed as ``self.val_sets: dict[name, list[PromptSample]]``;
they are scored by the benchmark-eval callback through the rollout engine, not by
Lightning's validation loop.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from arlopti.prompts.batch import PromptBatch, PromptSample, collate_prompts
from arlopti.prompts.records import PromptRecord, tokenize_records

log = logging.getLogger(__name__)


class _Indexed(Dataset):
    """Maps the sampler's ``(epoch, batch, index)`` keys to samples and keeps the position."""

    def __init__(self, samples: list[PromptSample]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        epoch, batch, i = key
        return self.samples[i], (epoch, batch)


def _collate(items) -> PromptBatch:
    return collate_prompts([s for s, _ in items], position=items[0][1])


class ResumableBatchSampler(Sampler):
    """Per-rank batches of a deterministic, epoch-seeded permutation, resumable mid-epoch.

    Global batch ``b`` of epoch ``e`` is ``perm_e[b*P:(b+1)*P]`` with ``perm_e`` drawn from
    ``seed + e``; rank ``r`` of ``W`` takes its ``r``-th contiguous ``P/W`` slice. The sampler
    skips the ``consumed`` batches of the current epoch, so a restored state continues exactly.

    Resume contract with Lightning's loop: ``len()`` is always the whole epoch (Lightning adds
    the batches it already counted to what the restarted iterator yields, as it does for a
    stateful loader), and ``set_epoch(e)`` only moves the sampler *forward*: a call with an
    earlier epoch (Lightning asks for the checkpoint's epoch before it notices that a checkpoint
    written after an epoch's last batch has finished that epoch) keeps the restored position.
    """

    def __init__(self, num_samples: int, global_batch: int, world_size: int, rank: int,
                 seed: int, shuffle: bool = True):
        if global_batch % world_size:
            raise ValueError(
                f"data.prompts_per_step={global_batch} is not divisible by trainer.devices x num_nodes="
                f"{world_size}; every rank must get whole prompts (and so whole GRPO groups)"
            )
        if num_samples < global_batch:
            raise ValueError(
                f"the training set has {num_samples} prompts after filtering, fewer than "
                f"data.prompts_per_step={global_batch}"
            )
        self.num_samples, self.global_batch = num_samples, global_batch
        self.world_size, self.rank, self.seed, self.shuffle = world_size, rank, seed, shuffle
        self.epoch, self.consumed = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return self.num_samples // self.global_batch  # drop_last: every step is full-sized

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng(self.seed + epoch).permutation(self.num_samples)

    def __iter__(self):
        epoch, start = self.epoch, self.consumed
        perm = self.order(epoch)
        per_rank = self.global_batch // self.world_size
        for b in range(start, self.batches_per_epoch):
            lo = b * self.global_batch + self.rank * per_rank
            yield [(epoch, b, int(i)) for i in perm[lo:lo + per_rank]]

    def __len__(self) -> int:
        return self.batches_per_epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch > self.epoch:
            self.epoch, self.consumed = epoch, 0

    def extra_indices(self, position: tuple[int, int], round_index: int) -> list[int]:
        """This rank's sample indices for dynamic-sampling round ``round_index`` (>= 1) of the step
        whose main batch is at ``position``: the module docstring's rule, with the pool's
        permutation drawn from ``numpy.random.default_rng([seed, epoch, batch, 0xDA90])``."""
        if round_index < 1:
            raise ValueError(f"round_index={round_index}: round 0 is the main batch; extra rounds start at 1")
        epoch, b = int(position[0]), int(position[1])
        main = self.order(epoch)[b * self.global_batch:(b + 1) * self.global_batch]
        pool = np.setdiff1d(np.arange(self.num_samples), main)
        if len(pool) < self.global_batch:
            pool = np.arange(self.num_samples)
        perm = np.random.default_rng([self.seed, epoch, b, 0xDA90]).permutation(pool)
        per_rank = self.global_batch // self.world_size
        start = (round_index - 1) * self.global_batch + self.rank * per_rank
        return [int(perm[(start + j) % len(perm)]) for j in range(per_rank)]

    def position_after(self, position: tuple[int, int], steps: int) -> tuple[int, int]:
        """The position ``steps`` batches after ``position`` (into the next epochs as needed)."""
        flat = int(position[0]) * self.batches_per_epoch + int(position[1]) + int(steps)
        return divmod(flat, self.batches_per_epoch)

    def indices_at(self, position: tuple[int, int]) -> list[int]:
        """This rank's sample indices of the batch at ``position`` (what ``__iter__`` yields there)."""
        epoch, b = int(position[0]), int(position[1])
        per_rank = self.global_batch // self.world_size
        lo = b * self.global_batch + self.rank * per_rank
        return [int(i) for i in self.order(epoch)[lo:lo + per_rank]]

    def mark_consumed(self, position: tuple[int, int]) -> None:
        epoch, batch = position
        self.epoch, self.consumed = epoch, batch + 1
        if self.consumed >= self.batches_per_epoch:
            self.epoch, self.consumed = epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed,
                "num_samples": self.num_samples, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict) -> None:
        for key in ("num_samples", "global_batch", "seed"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"checkpoint data position was saved with {key}={state[key]} but this run has "
                    f"{key}={getattr(self, key)}; resume with the same data config"
                )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


#: In the error for a validation set whose every prompt is over the length limit (data.preview reports it).
VAL_ALL_TOO_LONG = "is longer than the validation prompt-length limit"


class PromptDataModule(L.LightningDataModule):
    """Base class; see the module docstring. Subclasses implement the two ``*_records`` methods."""

    task_name = "task"

    def __init__(self, tokenizer=None, prompts_per_step: int = 8, max_prompt_length: int = 512,
                 seed: int = 42, shuffle: bool = True, num_workers: int = 0,
                 val_max_prompt_length: int | None = None):
        super().__init__()
        for key, value in (("max_prompt_length", max_prompt_length), ("val_max_prompt_length", val_max_prompt_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"data.{key}={value!r} must be a positive integer (tokens)"
                                 + (" or null (= data.max_prompt_length)" if key.startswith("val") else ""))
        self.tokenizer = tokenizer
        self.prompts_per_step = prompts_per_step
        self.max_prompt_length = max_prompt_length
        self.val_max_prompt_length = val_max_prompt_length
        self.seed = seed
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.train_samples: list[PromptSample] = []
        self.val_sets: dict[str, list[PromptSample]] = {}
        self.filtered_counts: dict[str, int] = {}
        self._sampler: ResumableBatchSampler | None = None
        self._pending_state: dict | None = None

    # ---- to implement -----------------------------------------------------------------------
    def train_records(self) -> list[PromptRecord]:
        raise NotImplementedError

    def val_records(self) -> dict[str, list[PromptRecord]]:
        return {}

    # ---- Lightning hooks --------------------------------------------------------------------
    def set_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def setup(self, stage: str | None = None) -> None:
        if self.train_samples:
            return
        if self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}: call set_tokenizer(tokenizer) before setup()")
        self.train_samples, dropped = tokenize_records(
            self.train_records(), self.tokenizer, self.max_prompt_length, f"{self.task_name}/train")
        self.filtered_counts["train"] = dropped
        val_limit = self.val_max_prompt_length or self.max_prompt_length
        emptied = []
        for name, records in self.val_records().items():
            self.val_sets[name], self.filtered_counts[name] = tokenize_records(
                records, self.tokenizer, val_limit, f"{self.task_name}/{name}")
            if not self.val_sets[name]:
                emptied.append(f"validation set {name} ({self.task_name}): every one of its {len(records)} prompts "
                               f"{VAL_ALL_TOO_LONG} {val_limit} ("
                               + ("data.val_max_prompt_length" if self.val_max_prompt_length else
                                  "data.max_prompt_length") + ")")
        world, rank = 1, 0
        if getattr(self, "trainer", None) is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
        self._sampler = ResumableBatchSampler(
            len(self.train_samples), self.prompts_per_step, world, rank, self.seed, self.shuffle)
        if self._pending_state is not None:
            self._sampler.load_state_dict(self._pending_state)
            self._pending_state = None
        if emptied:  # as an empty validation file: an error, never a silent gap in val/<task>/mean
            raise ValueError("; ".join(emptied) + "; raise that limit, or fix or remove the set")

    def train_dataloader(self) -> DataLoader:
        assert self._sampler is not None, "setup() first"
        if getattr(self, "trainer", None) is not None:
            self._sampler.set_epoch(self.trainer.current_epoch)
        # The position is restored through this DataModule's state_dict, so Lightning's warning that
        # a mid-epoch resume with a plain DataLoader "can cause unreliable results" does not apply.
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        # Its own generator: creating the iterator (every epoch, and on resume) must not draw from
        # torch's global RNG, or a resumed run's random stream would shift by one draw.
        return DataLoader(_Indexed(self.train_samples), batch_sampler=self._sampler,
                          collate_fn=_collate, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed))

    def extra_batch(self, position: tuple[int, int], round_index: int) -> PromptBatch:
        """This rank's extra prompts for dynamic-sampling round ``round_index`` (>= 1) of the rollout
        step whose main batch is at ``position`` (module docstring); carries that ``position``."""
        assert self._sampler is not None, "setup() first"
        idx = self._sampler.extra_indices(position, round_index)
        return collate_prompts([self.train_samples[i] for i in idx], position=tuple(position))

    def batch_ahead(self, position: tuple[int, int], steps: int) -> PromptBatch:
        """This rank's batch ``steps`` rollout steps after the one at ``position``: what the loader will
        yield then (rollout.placement=server generates it ahead; the rollout callback checks it is)."""
        assert self._sampler is not None, "setup() first"
        pos = self._sampler.position_after(position, steps)
        return collate_prompts([self.train_samples[i] for i in self._sampler.indices_at(pos)], position=pos)

    def mark_consumed(self, batch: PromptBatch) -> None:
        if self._sampler is not None:
            self._sampler.mark_consumed(batch.position)

    def state_dict(self) -> dict:
        return {"sampler": self._sampler.state_dict() if self._sampler else self._pending_state}

    def load_state_dict(self, state: dict) -> None:
        sampler_state = state.get("sampler")
        if sampler_state is None:
            return
        if self._sampler is not None:
            self._sampler.load_state_dict(sampler_state)
        else:
            self._pending_state = sampler_state
