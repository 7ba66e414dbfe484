"""The rollout callback's ``rollout.placement=server`` path: workers started, batches taken, experience built.

:func:`start_server_rollouts` (the callback's ``setup``) takes the trainer's base identity before any
weight is trained or restored (Lightning restores a checkpoint after ``setup``), then starts or connects
to the workers (:meth:`arlopti.rollout.server_rollouts.ServerRollouts.start`), which refuse another base.

:func:`server_experience` (each step's ``on_train_batch_start``) gets the step's completions from the
queue (generated ahead within ``rollout.async.max_staleness``), scores them with the tasks exactly as
the colocated path does, and builds the :class:`~arlopti.learner.experience.Experience` with every
row's policy version (``policy_versions``) and the behaviour log-probs (``engine_logprobs``). The
learner recomputes pi_old with its current weights, checks the staleness bound before any update, and
weighs pi_old / pi_behaviour with the rollout correction (docs/algorithms.md).

With ``rollout.server.check_sync`` every sync is followed by a probe: the worker samples a few tokens
of the step's first prompt with their log-probs, and the trainer's own log-probs of the same tokens must
agree within ``rollout.server.sync_check_tol`` (:func:`check_worker_agrees`).
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path

import torch

from arlopti.learner.experience import build_experience
from arlopti.models.lora import base_identity, base_model_of
from arlopti.rollout.engine import SamplingConfig
from arlopti.rollout.lora_sync import engine_named_params
from arlopti.rollout.vllm_startup import resolve_dtype
from arlopti.rollout.weight_sync import named_sync_params

log = logging.getLogger(__name__)


def start_server_rollouts(trainer, pl_module, group_size: int):
    """The callback's ``ServerRollouts`` (module docstring); stopped at exit whatever happens."""
    from arlopti.rollout.server_rollouts import ServerRollouts

    identity = base_identity(base_model_of(pl_module.policy))
    run_dir = Path(trainer.default_root_dir) / "rollout_workers"
    cfg = pl_module.cfg
    pool = ServerRollouts.start(cfg.model, cfg.rollout, identity, pl_module.tokenizer, group_size, run_dir,
                                rank=trainer.global_rank, world=trainer.world_size)
    atexit.register(pool.close)
    return pool


def _tied(policy) -> bool:
    return bool(getattr(base_model_of(policy).config, "tie_word_embeddings", False))


def server_experience(callback, trainer, pl_module, batch):
    """Step ``pl_module.rollout_step``'s experience from the workers (module docstring)."""
    from arlopti.callbacks.rollout import prompt_datamodule_of, round_seed

    r, rank, step = pl_module.cfg.rollout, trainer.global_rank, pl_module.rollout_step
    policy = pl_module.policy
    dm = prompt_datamodule_of(trainer, "rollout.placement=server generates the next steps' prompts ahead")
    wire = resolve_dtype(r.dtype, next(p.dtype for p in policy.parameters() if p.is_floating_point()))

    def sampling_for(s: int) -> SamplingConfig:
        return callback.sampling(pl_module, round_seed(r.seed, s, rank))

    def items():
        return named_sync_params(engine_named_params(policy, True), _tied(policy))

    server = callback.server
    synced_before = server.version
    completions, version, stats = server.completions(step, batch, lambda j: dm.batch_ahead(batch.position, j),
                                                     items, sampling_for, wire)
    if r.server.check_sync and server.version != synced_before:
        for w in server.workers:
            check_worker_agrees(w, policy, batch.prompt_ids[0], r.temperature, r.server.sync_check_tol,
                                callback.server._http, pl_module.tokenizer)
    timings = {"rollout_s": stats.pop("trainer_wait_s"), "sync_s": stats.pop("sync_s"), "scoring_s": 0.0}
    groups = callback.score(batch, completions, pl_module, timings)
    exp = build_experience([g.prompt_ids for g in groups], [g.completions for g in groups],
                           [x for g in groups for x in g.results], pad_id=pl_module.tokenizer.pad_token_id,
                           group_offset=rank * len(groups), prompt_texts=[g.prompt_text for g in groups],
                           metas=[g.meta for g in groups])
    exp.timings = timings
    exp.policy_versions = torch.full((len(exp),), version, dtype=torch.long)
    exp.async_stats = {"trainer_wait_s": timings["rollout_s"], "sync_s": timings["sync_s"], **stats}
    return exp


@torch.no_grad()
def check_worker_agrees(worker, policy, prompt: list[int], temperature: float, tol: float, pool, tokenizer,
                        tokens: int = 8) -> float:
    """Sample ``tokens`` tokens of ``prompt`` on ``worker`` with their log-probs and compare them with the
    trainer's log-probs of the same tokens at the same temperature; raises beyond ``tol``. Returns the
    largest difference."""
    from arlopti.rollout.server_client import WorkerError

    sampling = SamplingConfig(temperature=temperature, max_new_tokens=tokens, seed=0, logprobs=True)
    (group,) = worker.generate([prompt], 0, 1, sampling, tokenizer, pool)
    c = group[0]
    device = next(policy.parameters()).device
    ids = torch.tensor([list(prompt) + c.token_ids], device=device)
    logp = policy(ids, torch.ones_like(ids), len(prompt), temperature)
    logp = logp[0] if isinstance(logp, tuple) else logp
    gap = float((logp[0, :len(c.token_ids)].float().cpu() - torch.tensor(c.logprobs)).abs().max())
    if not gap <= tol:
        raise WorkerError(worker.name, f"after the sync to version {worker.version} its log-probs differ from the "
                                       f"trainer's by up to {gap:.3g} > rollout.server.sync_check_tol={tol}: the "
                                       "weights did not arrive intact")
    log.info("%s agrees with the trainer after the sync to version %s (max |dlogp| %.2g)", worker.name,
             worker.version, gap)
    return gap


__all__ = ["check_worker_agrees", "server_experience", "start_server_rollouts"]
