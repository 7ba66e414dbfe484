"""Rollout-worker URLs from the job's nodes (arlopti/config/job_hosts.py): SLURM's compressed node
lists read by hand, and the ``${job_urls:PORT,PER_NODE}`` resolver in a composed config."""

from __future__ import annotations

import socket

import pytest

from arlopti.config.job_hosts import expand_nodelist, job_urls
from helpers.compose import compose_train


@pytest.mark.parametrize("nodelist, hosts", [
    ("node7", ["node7"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("gpu[9-11],head", ["gpu9", "gpu10", "gpu11", "head"]),
    ("r[1-2]-n[09-10],x-ib", ["r1-n09", "r1-n10", "r2-n09", "r2-n10", "x-ib"]),
])
def test_slurm_node_lists_expand_in_order(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_a_bad_range_is_named():
    with pytest.raises(ValueError, match=r"bad range \[5-3\]"):
        expand_nodelist("n[5-3]")


def test_urls_go_node_by_node_so_each_rank_gets_a_worker_on_its_own_node(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    assert job_urls(8100, 2) == ["gpu01:8100", "gpu01:8101", "gpu02:8100", "gpu02:8101"]
    assert job_urls(8100, 1, 1) == ["gpu02:8100"]  # node 0 runs the trainer alone
    with pytest.raises(ValueError, match="the job has 2 node"):
        job_urls(8100, 1, 2)
    cfg = compose_train(["debug=smoke", "rollout.placement=server", "rollout.server.spawn=false",
                         "rollout.server.urls=${job_urls:8100,1}"], tmp_path)
    assert list(cfg.rollout.server.urls) == ["gpu01:8100", "gpu02:8100"]
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    assert job_urls("8100") == [f"{socket.gethostname()}:8100"]  # outside SLURM: this host
    with pytest.raises(ValueError, match="job_urls:0,1"):
        job_urls(0)
