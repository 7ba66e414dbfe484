"""A run as a submitit job (arlopti/entry/cluster.py): the job's nodes, submitit's preemption signal
handed back after the checkpoint, and the ranks a sweep's job cannot start itself. The launch itself,
requeue included, runs in tests/entry/test_sweeps.py (submitit_local)."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import arlopti.entry.failures
from arlopti.callbacks.checkpointing import RolloutCheckpoint
from arlopti.config import ConfigError
from arlopti.entry.cluster import check_multirun_ranks, hand_back_if_preempted, prepare_job

JOB_VARS = ("SUBMITIT_EXECUTOR", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SUBMITIT_LOCAL_JOB_NUM_NODES",
            "SUBMITIT_PREEMPT_SIGNAL", "LOCAL_RANK", "SLURM_PROCID")


@pytest.fixture()
def env(monkeypatch):
    for var in JOB_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def cfg(num_nodes=1):
    return OmegaConf.create({"trainer": {"num_nodes": num_nodes},
                             "callbacks": {"model_checkpoint": {"signals": ["SIGTERM", "SIGUSR1", "SIGINT"]}}})


def test_outside_a_submitit_job_nothing_changes(env):
    c = cfg()
    prepare_job(c)
    assert c == cfg()


def test_a_slurm_job_gives_its_node_count_and_its_signal(env):
    env.setenv("SUBMITIT_EXECUTOR", "slurm")
    env.setenv("SLURM_JOB_NUM_NODES", "2")
    c = cfg()
    prepare_job(c)
    assert c.trainer.num_nodes == 2
    assert list(c.callbacks.model_checkpoint.signals) == ["SIGTERM", "SIGUSR1", "SIGINT", "SIGUSR2"]
    with pytest.raises(ConfigError, match=r"trainer.num_nodes=4 in a job of 2 node\(s\).*hydra.launcher.nodes=4"):
        prepare_job(cfg(num_nodes=4))


def module_stopped_by(tmp_path, name: str | None):
    ckpt = RolloutCheckpoint(str(tmp_path / "checkpoints"))
    if name is not None:
        (tmp_path / "checkpoints").mkdir(exist_ok=True)
        (tmp_path / "checkpoints" / "PREEMPTED").write_text(json.dumps({"rollout_step": 1, "signal": name}))
    return SimpleNamespace(preempted=name is not None, trainer=SimpleNamespace(callbacks=[ckpt]))


@pytest.mark.parametrize("executor, stopped, handed", [(None, "SIGUSR2", False), ("local", None, False),
                                                       ("local", "SIGINT", False), ("local", "SIGUSR2", True),
                                                       ("slurm", "SIGTERM", True)])
def test_the_signal_goes_back_to_submitit_only_after_a_preemption(env, tmp_path, executor, stopped, handed):
    if executor:
        env.setenv("SUBMITIT_EXECUTOR", executor)
    raised = []
    env.setattr(signal, "raise_signal", raised.append)
    hand_back_if_preempted(module_stopped_by(tmp_path, stopped))
    assert raised == ([signal.SIGUSR2] if handed else [])


def test_a_sweeps_job_cannot_start_ranks_itself(env):
    two = SimpleNamespace(num_devices=2, num_nodes=1)
    env.setattr(arlopti.entry.failures, "in_multirun", lambda: True)
    with pytest.raises(ConfigError, match="2 ranks in a --multirun job.*hydra/launcher=slurm"):
        check_multirun_ranks(two)
    check_multirun_ranks(SimpleNamespace(num_devices=1, num_nodes=1))
    env.setenv("SLURM_PROCID", "0")  # srun started the ranks
    check_multirun_ranks(two)
    env.delenv("SLURM_PROCID")
    env.setattr(arlopti.entry.failures, "in_multirun", lambda: False)
    check_multirun_ranks(two)


def test_ctrl_c_in_a_sweep_run_here_ends_the_sweep_after_the_save(env, tmp_path):
    import arlopti.entry.cluster as cluster

    recorded = []
    env.setattr(arlopti.entry.failures, "in_multirun", lambda: True)
    env.setattr(cluster, "record_interrupted", lambda sig, ckpt: recorded.append((sig, ckpt)))
    module = module_stopped_by(tmp_path, "SIGINT")
    with pytest.raises(SystemExit, match=r"SIGINT: the sweep stops here; this job saved .*checkpoints/last.ckpt"):
        cluster.stop_sweep_if_interrupted(module)
    assert recorded == [("SIGINT", f"{tmp_path / 'checkpoints'}/last.ckpt")]
    cluster.stop_sweep_if_interrupted(module_stopped_by(tmp_path / "b", None))  # ended by itself: goes on
    env.setenv("SUBMITIT_EXECUTOR", "local")  # submitit requeues instead
    cluster.stop_sweep_if_interrupted(module)
    assert len(recorded) == 1


def test_the_slurm_launcher_runs_one_task_per_gpu_and_leaves_time_to_save():
    from hydra import compose

    from arlopti.config.compose import hydra_context

    with hydra_context():
        cfg = compose("train.yaml", ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (4, 4, 1)
    assert launcher.signal_delay_s >= 120 and launcher.max_num_timeout > 0
