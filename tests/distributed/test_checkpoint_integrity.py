"""FSDP2 checkpoints on 2 CPU ranks (gloo): integrity and poisoned weights (issue 14, rows 2 and 3).

One ``torchrun --nproc_per_node=2`` launch of :func:`worker`:

* 2 rollout steps under FSDP2 saving every step: ``last.ckpt`` (a distributed-checkpoint folder
  with its sha256 manifest) and the previous save kept as ``last.ckpt.old``;
* a run whose optimizer step poisons one weight *on rank 1 only* (its loss and gradient finite):
  the flag is all-reduced, so both ranks abort with :class:`NonFiniteAbort` and no checkpoint of
  the poisoned state is written.

Then, in the test process: bytes flipped in a shard of ``last.ckpt`` give a :class:`CheckpointError`
naming the shard and the tensors it holds, ``ckpt_path=last`` falls back to ``last.ckpt.old``,
and every checkpoint the poisoned run left is finite.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from helpers.torchrun import launch_two_ranks

HERE = Path(__file__).resolve()
TESTS = HERE.parents[1]


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from arlopti.callbacks.checkpointing import RolloutCheckpoint
    from arlopti.learner.guard import NonFiniteAbort
    from arlopti.learner.sharding import FSDP2Strategy
    from arlopti.models.loading import build_tiny_tokenizer
    from test_data_parallel import fit

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer()
    fit("resume", tok, 2, FSDP2Strategy(), devices=2,
        callbacks=[RolloutCheckpoint(str(out / "good" / "checkpoints"), every_n_steps=1)])

    real = torch.optim.AdamW.step
    calls = {"n": 0}

    def poison_on_rank1(self, *a, **k):
        res = real(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == 3 and dist.get_rank() == 1:  # rollout step 1's first step; step 0 was saved
            with torch.no_grad():
                p = self.param_groups[0]["params"][0]
                (p.to_local() if hasattr(p, "to_local") else p).view(-1)[0] = math.nan
        return res

    torch.optim.AdamW.step = poison_on_rank1
    message = None
    try:
        fit("resume", tok, 3, FSDP2Strategy(), devices=2,
            callbacks=[RolloutCheckpoint(str(out / "poisoned" / "checkpoints"), every_n_steps=1)])
    except NonFiniteAbort as err:
        message = str(err)
    finally:
        torch.optim.AdamW.step = real
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"abort": message}))
    dist.barrier()


pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    out = tmp_path_factory.mktemp("integrity")
    launch_two_ranks(HERE, out, "rank1.json")
    return out


def test_a_flipped_fsdp2_shard_is_named_and_last_falls_back(two_rank, tmp_path, monkeypatch, caplog):
    import logging
    import re
    import shutil

    from arlopti.checkpoints.resume import MANIFEST, RESOLVED_ENV, CheckpointError, resolve_ckpt_path, validate_checkpoint

    monkeypatch.delenv(RESOLVED_ENV, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    src = two_rank / "good" / "checkpoints"
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(src, ckpts)
    last, old = ckpts / "last.ckpt", ckpts / "last.ckpt.old"
    assert last.is_dir() and old.is_dir() and (last / MANIFEST).is_file() and (old / MANIFEST).is_file()
    assert validate_checkpoint(last) == last
    shards = sorted(last.glob("*.distcp"))
    assert len(shards) == 2  # one per rank
    shard = shards[1]
    data = bytearray(shard.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 400):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint file {shard} (holds ") + r".*\) is corrupt: "
                       + re.escape(f"its sha256 differs from the one in {MANIFEST}")):
        validate_checkpoint(last)
    with caplog.at_level(logging.WARNING, logger="arlopti.checkpoints.resume"):
        found = resolve_ckpt_path("last", output_dir=tmp_path / "run", log_dir=tmp_path / "logs", task_name="t",
                                  run_name="r")
    assert found == str(old) and f"falling back to the newest intact checkpoint {old}" in caplog.text


def test_weights_poisoned_on_one_rank_abort_both_with_only_finite_checkpoints(two_rank):
    import torch
    import torch.distributed.checkpoint as dcp

    from arlopti.learner.guard import tensors_finite

    messages = [json.loads((two_rank / f"rank{r}.json").read_text())["abort"] for r in (0, 1)]
    for m in messages:
        assert m is not None and "at rollout step 1 made the weights non-finite" in m, messages
    folder = two_rank / "poisoned" / "checkpoints"
    saved = sorted(p for p in folder.iterdir() if p.name.startswith("last.ckpt"))
    assert [p.name for p in saved] == ["last.ckpt"], saved  # rollout step 0's save only
    reader = dcp.FileSystemReader(str(saved[0]))
    meta = reader.read_metadata()
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in meta.state_dict_metadata.items()
             if hasattr(v, "size") and hasattr(v, "properties")}
    dcp.load(state, storage_reader=reader, no_dist=True)
    assert state and bool(tensors_finite(state.values()))


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(HERE.parent))
    worker(Path(sys.argv[1]))
