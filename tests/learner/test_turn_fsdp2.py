"""Multi-turn episodes under FSDP2 on 2 ranks (gloo, CPU), HF rollouts on the sharded policy.

Rank 0's episodes end after their first turn and rank 1's run three: the HF engine's ``generate`` gathers the
sharded weights with the other rank (a collective), so every rank makes every turn's call, empty ones included
(``lockstep``, :mod:`arlopti.rollout.turns`). Without it rank 1 would wait for rank 0 forever. Checked: both ranks
finish two steps, each rank's turns are its own, the reduced ``turns/*`` tags, and the ranks hold the same weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.torchrun import launch_two_ranks

HERE = Path(__file__).resolve()


def worker(out: Path) -> None:
    import lightning.pytorch as L
    import torch
    import torch.distributed as dist

    from arlopti.callbacks.rollout import RolloutCallback
    from arlopti.config import OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.config.schema import EnvConfig
    from arlopti.learner.module import GRPOModule
    from arlopti.learner.sharding import FSDP2Strategy, full_state_dict
    from arlopti.models.loading import build_tiny_tokenizer
    from arlopti.tasks.env import TextEnv
    from arlopti.tasks.env.loading import register_env
    from helpers.toy import ToyDataModule

    class RankEnv(TextEnv):
        """Done at once on rank 0; replies on rank 1 (so rank 1 runs every turn)."""

        def reset(self, row):
            return None

        def step(self, text):
            return (None, True, None) if dist.get_rank() == 0 else ("go on", False, 0.5)

    class Turns(L.Callback):
        def __init__(self):
            self.rows = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            m = pl_module.last_step_context.metrics
            self.rows.append({"mine": [e["turns"] for e in batch.experience.episode_metas],
                              "turns_mean": m["turns/mean"], "turns_max": m["turns/max"]})

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer()
    L.seed_everything(3, verbose=False)
    cfg = RunConfig(sizes=SizesConfig(prompts_per_step=2, group_size=2, mini_batch_size=4, micro_batch_size=2,
                                      logprob_micro_batch_size=2),
                    optim=OptimConfig(lr=1e-3), rollout=RolloutConfig(temperature=1.0, max_new_tokens=4, max_turns=3,
                                                                      max_episode_tokens=64))
    module = GRPOModule(cfg, tokenizer=tok, total_rollout_steps=2)
    # Every turn ends after its first token, whatever the random model samples: every id ends a turn for the HF
    # engine (a turn cut at max_new_tokens would end rank 1's episodes at turn 1). A turn that samples the chat
    # EOS gets its reply as a chat message (about 10 tokens): max_episode_tokens=64 holds 3 turns and 2 of them
    # (the default, 3 x 4 = 12, rolls the first one back).
    module.policy.hf.generation_config.eos_token_id = list(range(module.policy.hf.config.vocab_size))
    rec = Turns()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=FSDP2Strategy(), max_epochs=1, logger=False,
                        enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0,
                        use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RolloutCallback(group_size=2, env=EnvConfig(env=register_env(RankEnv))), rec])
    trainer.fit(module, datamodule=ToyDataModule(tokenizer=tok, prompts_per_step=2, max_prompt_length=256))
    params = full_state_dict(module.policy)  # collective
    rank = dist.get_rank()
    digest = float(sum(v.double().sum() for v in params.values()))
    (out / f"rank{rank}.json").write_text(json.dumps({"rows": rec.rows, "digest": digest,
                                                      "steps": module.rollout_step}))
    dist.barrier()
    if rank == 0:
        (out / "done.json").write_text("{}")


pytestmark = pytest.mark.distributed


def test_ranks_whose_episodes_end_at_different_turns_stay_in_step(tmp_path):
    launch_two_ranks(HERE, tmp_path, "done.json", timeout_s=300)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["steps"] == r1["steps"] == 2 and r0["digest"] == r1["digest"]
    for a, b in zip(r0["rows"], r1["rows"]):
        assert set(a["mine"]) == {1} and set(b["mine"]) == {3}
        assert a["turns_max"] == b["turns_max"] == 3.0 and a["turns_mean"] == b["turns_mean"] == 2.0


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
