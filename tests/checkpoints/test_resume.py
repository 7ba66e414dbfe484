"""Which checkpoint a run resumes from (``arlopti.checkpoints.resume``), on plain paths: ``ckpt_path=last`` /
``auto`` / a run directory / a file, the ``last.ckpt.old`` fallback, truncated files and shards
named before anything is loaded, and damaged ones (bytes flipped in a tensor blob or a shard: the
zip entry's CRC-32, the folder's sha256 manifest) named, with ``last``/``auto`` falling back to the
newest intact checkpoint. Then ``arlopti.entry.train.resume_from``, which reads the
directories from a composed config and exports rank 0's answer for the ranks it launches.

The checkpoints here are ``torch.save`` files with Lightning's layout (a zip with a ``data.pkl``)
and a distributed-checkpoint folder: the checks look at the files, never at the weights. Saving,
reading and resuming real checkpoints is in tests/callbacks/test_checkpointing.py.
"""

from __future__ import annotations

import os
import re
import warnings

import pytest
import torch

from arlopti.checkpoints.resume import (RESOLVED_ENV, CheckpointError, CheckpointNotFoundError, find_last_checkpoint,
                            inherited_answer, resolve_ckpt_path, validate_checkpoint)
from helpers.zip_bytes import flip_entry_bytes


@pytest.fixture()
def saved_ckpt(tmp_path_factory):
    """A complete single-file checkpoint with Lightning's top-level keys."""
    path = tmp_path_factory.mktemp("saved") / "last.ckpt"
    g = torch.Generator().manual_seed(0)
    torch.save({"state_dict": {"policy.w": torch.randn(64, 64, generator=g), "policy.b": torch.randn(64, generator=g)},
                "arlopti": {"rollout_step": 1}, "hyper_parameters": {}, "optimizer_states": []}, path)
    return path


@pytest.fixture(autouse=True)
def _no_inherited_answer(monkeypatch):
    """train.resume_from exports its answer for the ranks it launches; keep each test's own."""
    monkeypatch.delenv(RESOLVED_ENV, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_truncated_checkpoint_file_is_named(saved_ckpt, tmp_path):
    bad = tmp_path / "cut.ckpt"
    data = saved_ckpt.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=re.escape(str(bad)) + ".*truncated or corrupt"):
        validate_checkpoint(bad)
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.ckpt is truncated or corrupt"):
        validate_checkpoint(tmp_path / "junk.ckpt")
    with pytest.raises(CheckpointError, match="cut.ckpt"):
        resolve_ckpt_path(str(bad))
    assert validate_checkpoint(saved_ckpt) == saved_ckpt


def dcp_save_in_one_process(dcp, state, folder):
    """``dcp.save`` without a process group. DCP warns that it saves in one process, once per process
    (so not in a pytest-xdist worker that saved before): the warning is dropped, not asserted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder))


def test_truncated_distributed_shard_is_named(saved_ckpt, tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    ckpt = torch.load(saved_ckpt, weights_only=False)
    dcp_save_in_one_process(dcp, {"state_dict": ckpt.pop("state_dict")}, folder)
    torch.save({k: v for k, v in ckpt.items() if k != "optimizer_states"}, folder / "meta.pt")
    assert validate_checkpoint(folder) == folder
    shard = next(folder.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=re.escape(str(shard)) + " is truncated"):
        validate_checkpoint(folder)
    (folder / "meta.pt").unlink()
    with pytest.raises(CheckpointError, match="has no meta.pt"):
        validate_checkpoint(folder)


def test_find_last_checkpoint_prefers_this_run_then_the_newest(tmp_path):
    runs = tmp_path / "logs" / "t" / "a0.3_s1"  # logs/<task_name>/<run_name>/<time>
    for i, name in enumerate(["2026-01-01_00-00-00", "2026-01-02_00-00-00"]):
        (runs / name / "checkpoints").mkdir(parents=True)
        f = runs / name / "checkpoints" / "last.ckpt"
        f.write_bytes(b"x")
        os.utime(f, (1000 + i, 1000 + i))
    own = tmp_path / "own"
    (own / "checkpoints").mkdir(parents=True)
    where = dict(output_dir=own, log_dir=tmp_path / "logs", task_name="t", run_name="a0.3_s1")
    # another algorithm's runs of the same task are not this run's
    assert find_last_checkpoint(**{**where, "run_name": "s1"}) is None
    assert find_last_checkpoint(**where) == runs / "2026-01-02_00-00-00" / "checkpoints" / "last.ckpt"
    assert find_last_checkpoint(**{**where, "output_dir": None}) == find_last_checkpoint(**where)  # no Hydra runtime
    (own / "checkpoints" / "last.ckpt.old").write_bytes(b"x")  # a save interrupted mid-rename
    assert find_last_checkpoint(**where) == own / "checkpoints" / "last.ckpt.old"
    (own / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert find_last_checkpoint(**where) == own / "checkpoints" / "last.ckpt"
    assert find_last_checkpoint(output_dir=tmp_path, log_dir=tmp_path, task_name="none", run_name="s1") is None


def test_ckpt_path_auto_and_last(saved_ckpt, tmp_path):
    run_dir = tmp_path / "logs" / "t" / "s1" / "fixed"
    where = dict(output_dir=run_dir, log_dir=tmp_path / "logs", task_name="t", run_name="s1")
    assert resolve_ckpt_path(None, **where) is None and resolve_ckpt_path("", **where) is None
    assert resolve_ckpt_path("auto", **where) is None  # nothing here yet: a fresh start
    with pytest.raises(FileNotFoundError, match="ckpt_path=last: no last.ckpt under"):
        resolve_ckpt_path("last", **where)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(saved_ckpt.read_bytes())
    want = str(run_dir / "checkpoints" / "last.ckpt")
    assert resolve_ckpt_path("auto", **where) == resolve_ckpt_path("last", **where) == want
    assert resolve_ckpt_path(str(run_dir), **where) == want  # a run directory
    assert resolve_ckpt_path(run_dir) == want  # which needs nothing of this run's
    assert RESOLVED_ENV not in os.environ  # arlopti.checkpoints.resume writes no environment: train.resume_from does


def test_explicit_paths_that_cannot_be_used_are_named(tmp_path):
    assert issubclass(CheckpointNotFoundError, CheckpointError) and issubclass(CheckpointNotFoundError,
                                                                               FileNotFoundError)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        resolve_ckpt_path(str(tmp_path / "nope.ckpt"))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="is a run directory without checkpoints/last.ckpt"):
        resolve_ckpt_path(str(tmp_path / "run"))


def test_launched_ranks_take_rank_zeros_answer_for_last(saved_ckpt, tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from arlopti.entry.train import resume_from

    where = dict(output_dir=tmp_path / "mine", log_dir=tmp_path / "logs", task_name="t", run_name="s1")
    env = {RESOLVED_ENV: str(saved_ckpt)}
    assert inherited_answer(env) is None  # rank 0 (no LOCAL_RANK) searches
    with pytest.raises(FileNotFoundError):
        resolve_ckpt_path("last", **where, inherited=inherited_answer(env))
    assert inherited_answer({**env, "LOCAL_RANK": "1"}) == str(saved_ckpt)
    assert resolve_ckpt_path("last", **where, inherited=str(saved_ckpt)) == str(saved_ckpt)
    # train.resume_from: rank 0 exports its answer, a launched rank reads it back
    monkeypatch.setenv(RESOLVED_ENV, "")  # so that the answer resume_from exports is undone after the test
    cfg = OmegaConf.create({"ckpt_path": str(saved_ckpt), "task_name": "t", "run_name": "s1",
                            "paths": {"log_dir": str(tmp_path / "logs"), "output_dir": str(tmp_path / "mine")}})
    assert resume_from(cfg) == str(saved_ckpt) == os.environ[RESOLVED_ENV]
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resume_from(OmegaConf.merge(cfg, {"ckpt_path": "last"})) == str(saved_ckpt)


def test_train_reads_the_run_directories_from_the_config(saved_ckpt, tmp_path):
    from omegaconf import OmegaConf

    from arlopti.entry.train import run_dirs

    def from_config(ckpt_path, cfg):
        return resolve_ckpt_path(ckpt_path, **run_dirs(cfg))

    run_dir = tmp_path / "logs" / "t" / "s1" / "fixed"
    cfg = OmegaConf.create({"task_name": "t", "run_name": "s1",
                            "paths": {"log_dir": str(tmp_path / "logs"), "output_dir": str(run_dir)}})
    assert from_config("auto", cfg) is None
    with pytest.raises(FileNotFoundError, match=re.escape(f"under {run_dir}/checkpoints nor under any earlier run "
                                                          f"of task_name=t, run_name=s1 in {tmp_path}/logs/t/s1")):
        from_config("last", cfg)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(saved_ckpt.read_bytes())
    want = str(run_dir / "checkpoints" / "last.ckpt")
    assert from_config("auto", cfg) == from_config("last", cfg) == from_config(str(run_dir), cfg) == want
    assert from_config(want, None) == want  # an explicit path needs no config
    no_runtime = OmegaConf.create({"task_name": "t", "run_name": "s1",
                                   "paths": {"log_dir": str(tmp_path / "logs"), "output_dir": "${hydra:runtime.output_dir}"}})
    assert from_config("auto", no_runtime) is None  # output_dir needs a Hydra runtime: no run directory


# ---- integrity: bytes changed after the save (issue 14, row 3) -------------------------------------------------


def flip_entry(path, suffix: str, n: int = 400) -> str:
    """Invert ``n`` bytes in the middle of the zip entry whose name ends with ``suffix``; returns its name."""
    return flip_entry_bytes(path, lambda z, i: i.filename.endswith(suffix), n)


def storage_key(path, tensor_key: str) -> str:
    """The zip entry (``data/<key>``) holding ``state_dict[tensor_key]``."""
    import zipfile

    ckpt = torch.load(path, map_location="cpu", weights_only=False)

    with zipfile.ZipFile(path) as z:  # match by content: the entry's bytes are the tensor's
        want = ckpt["state_dict"][tensor_key].numpy().tobytes()
        return next(n for n in z.namelist() if "/data/" in n and z.read(n) == want).rsplit("/", 1)[-1]


def test_flipped_bytes_in_a_tensor_blob_are_named(saved_ckpt, tmp_path):
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(saved_ckpt.read_bytes())
    key = storage_key(bad, "policy.w")
    entry = flip_entry(bad, f"/data/{key}")
    torch.load(bad, map_location="cpu", weights_only=False)  # torch itself loads it without complaint
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint file {bad} is corrupt: entry '{entry}' "
                                                        "(tensor state_dict.policy.w) fails its integrity check")):
        validate_checkpoint(bad)
    with pytest.raises(CheckpointError, match=re.escape(str(bad))):
        resolve_ckpt_path(str(bad))  # an explicit path: no fallback


def test_ckpt_path_last_falls_back_to_the_newest_intact_checkpoint(saved_ckpt, tmp_path, caplog):
    import logging

    logs = tmp_path / "logs" / "t" / "s1"
    earlier, own = logs / "2026-01-01_00-00-00" / "checkpoints", logs / "fixed" / "checkpoints"
    for d in (earlier, own):
        d.mkdir(parents=True)
    for f in (earlier / "last.ckpt", own / "last.ckpt", own / "last.ckpt.old"):
        f.write_bytes(saved_ckpt.read_bytes())
    os.utime(earlier / "last.ckpt", (1000, 1000))
    where = dict(output_dir=own.parent, log_dir=tmp_path / "logs", task_name="t", run_name="s1")
    flip_entry(own / "last.ckpt", "/data/0")
    with caplog.at_level(logging.WARNING, logger="arlopti.checkpoints.resume"):
        assert resolve_ckpt_path("last", **where) == str(own / "last.ckpt.old")
        assert resolve_ckpt_path("auto", **where) == str(own / "last.ckpt.old")
    assert f"skipping damaged checkpoint {own / 'last.ckpt'}" in caplog.text
    assert f"falling back to the newest intact checkpoint {own / 'last.ckpt.old'}" in caplog.text
    flip_entry(own / "last.ckpt.old", "/data/1")
    assert resolve_ckpt_path("last", **where) == str(earlier / "last.ckpt")  # an earlier run's
    with pytest.raises(CheckpointError, match="ckpt_path=auto: every candidate checkpoint is damaged"):
        resolve_ckpt_path("auto", **where)  # auto stays in this run's directory
    flip_entry(earlier / "last.ckpt", "/data/0")
    with pytest.raises(CheckpointError, match="ckpt_path=last: every candidate checkpoint is damaged"):
        resolve_ckpt_path("last", **where)


def test_a_flipped_distributed_shard_is_named(saved_ckpt, tmp_path):
    """A distributed-checkpoint folder (one process here; 2 FSDP2 ranks in
    tests/distributed/test_checkpoint_integrity.py) carries a sha256 manifest checked on load."""
    import torch.distributed.checkpoint as dcp

    from arlopti.checkpoints.resume import MANIFEST, write_manifest

    folder = tmp_path / "last.ckpt"
    ckpt = torch.load(saved_ckpt, weights_only=False)
    dcp_save_in_one_process(dcp, {"state_dict": ckpt.pop("state_dict")}, folder)
    torch.save({k: v for k, v in ckpt.items() if k != "optimizer_states"}, folder / "meta.pt")
    write_manifest(folder)
    assert (folder / MANIFEST).is_file() and validate_checkpoint(folder) == folder
    shard = next(folder.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 400):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint file {shard} (holds state_dict.policy.")
                       + r".*is corrupt: its sha256 differs"):
        validate_checkpoint(folder)


def distributed_folder(saved_ckpt, folder):
    """``saved_ckpt`` rewritten as a one-process distributed-checkpoint folder (``dcp.save`` + ``meta.pt``)."""
    import torch.distributed.checkpoint as dcp

    ckpt = torch.load(saved_ckpt, weights_only=False)
    dcp_save_in_one_process(dcp, {"state_dict": ckpt.pop("state_dict")}, folder)
    torch.save({k: v for k, v in ckpt.items() if k != "optimizer_states"}, folder / "meta.pt")
    return folder


def test_a_distributed_folder_under_a_single_file_trainer_is_refused_naming_ckpt_path(saved_ckpt, tmp_path):
    """Issue 38: ``ckpt_path=<a 2-rank FSDP2 run>`` with the default trainer died in Lightning with a bare
    IsADirectoryError."""
    from lightning.pytorch.strategies import ModelParallelStrategy, SingleDeviceStrategy

    from arlopti.checkpoints.resume import check_checkpoint_strategy
    from arlopti.config import ConfigError

    folder = distributed_folder(saved_ckpt, tmp_path / "last.ckpt")
    check_checkpoint_strategy(str(folder), ModelParallelStrategy())
    check_checkpoint_strategy(str(saved_ckpt), SingleDeviceStrategy("cpu"))
    with pytest.raises(ConfigError, match=r"ckpt_path=.*last\.ckpt is a distributed-checkpoint folder.*"
                                          r"SingleDeviceStrategy.*trainer=fsdp"):
        check_checkpoint_strategy(str(folder), SingleDeviceStrategy("cpu"))


def test_train_build_refuses_a_distributed_folder_before_any_model_loads(saved_ckpt, tmp_path, monkeypatch):
    import arlopti.entry.train as train_entry
    from arlopti.config import ConfigError
    from helpers.compose import compose_train

    folder = distributed_folder(saved_ckpt, tmp_path / "last.ckpt")
    monkeypatch.setattr(train_entry, "check_resume_compatible", lambda *a, **k: None)  # the folder's config is a stub
    with pytest.raises(ConfigError, match="is a distributed-checkpoint folder"):
        train_entry.build(compose_train(["debug=smoke", "data=kk_generated", "logger=none"], tmp_path / "run"),
                          str(folder))
