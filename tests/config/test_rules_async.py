"""The config rules of rollout.placement=server (issue 27): the effective rollout correction and what
a server run refuses."""

from __future__ import annotations

import logging

import pytest

from arlopti.config import (AlgorithmConfig, AsyncConfig, ConfigError, DapoConfig, RolloutConfig,
                            RolloutCorrectionConfig, RunConfig, ServerConfig, rules, validate_run)
from arlopti.config.rules import effective_correction_mode


def _rollout(placement: str = "colocated", k: int = 0, **kw) -> RolloutConfig:
    return RolloutConfig(placement=placement, async_=AsyncConfig(max_staleness=k), **kw)


@pytest.mark.parametrize("placement, k, mode, expected", [
    ("colocated", 0, "auto", "none"),
    ("colocated", 2, "auto", "none"),  # colocated samples come from the current weights
    ("server", 0, "auto", "none"),  # synchronous: the same update as colocated
    ("server", 1, "auto", "tis"),
    ("server", 4, "auto", "tis"),
    ("server", 2, "none", "none"),  # explicit modes are kept as given
    ("server", 2, "mis", "mis"),
    ("colocated", 0, "seq_tis", "seq_tis"),
])
def test_effective_correction_mode(placement, k, mode, expected):
    assert effective_correction_mode(_rollout(placement, k), RolloutCorrectionConfig(mode=mode)) == expected


def test_the_default_is_auto_and_resolves_to_none_for_every_existing_run():
    cfg = RunConfig()
    assert cfg.algorithm.rollout_correction.mode == "auto"
    assert effective_correction_mode(cfg.rollout, cfg.algorithm.rollout_correction) == "none"
    validate_run(RunConfig(rollout=RolloutConfig(return_logprobs=False)))  # none needs no engine log-probs


def test_auto_under_staleness_needs_the_engine_logprobs():
    cfg = RunConfig(rollout=_rollout("server", 2, return_logprobs=False))
    with pytest.raises(ConfigError, match=r"mode=auto is tis here .*max_staleness=2.*set rollout.return_logprobs=true"):
        validate_run(cfg)
    cfg.rollout.return_logprobs = True
    validate_run(cfg)


def test_explicit_none_with_staleness_is_allowed_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(rules, "_warned", set())
    cfg = RunConfig(algorithm=AlgorithmConfig(rollout_correction=RolloutCorrectionConfig(mode="none")),
                    rollout=_rollout("server", 3))
    with caplog.at_level(logging.WARNING, logger="arlopti.config.rules"):
        validate_run(cfg)
        validate_run(cfg)
    warnings = [r.message for r in caplog.records if "NeMo-RL" in r.message]
    assert len(warnings) == 1 and "max_staleness=3" in warnings[0]


@pytest.mark.parametrize("change, match", [
    (lambda c: setattr(c.algorithm, "dapo", DapoConfig(dynamic_sampling=True)),
     r"algorithm.dapo.dynamic_sampling=true is not built yet for rollout.placement=server.*dynamic_sampling=false"),
    (lambda c: setattr(c.rollout, "server", ServerConfig(spawn=False)),
     r"rollout.server.spawn=false with empty rollout.server.urls.*rollout.server.spawn=true"),
    (lambda c: setattr(c.rollout, "server", ServerConfig(spawn=True, urls=["h:8100"])),
     r"rollout.server.spawn=true with rollout.server.urls=\['h:8100'\].*rollout.server.urls=\[\]"),
    (lambda c: setattr(c.rollout, "server", ServerConfig(spawn=False, urls=["localhost"])),
     r"rollout.server.urls has 'localhost', which is not host:port"),
    (lambda c: setattr(c.rollout, "server", ServerConfig(spawn=False, urls=["127.0.0.1:99999"])),
     r"rollout.server.urls has '127.0.0.1:99999', which is not host:port \(a port in 1..65535"),
    (lambda c: setattr(c.rollout, "server", ServerConfig(spawn=False, urls=["not a url"])),
     r"rollout.server.urls has 'not a url'"),
    (lambda c: setattr(c.rollout.async_, "max_staleness", 1_000_000_000),
     r"rollout.async.max_staleness=1000000000: at most 32 batches are generated ahead"),
    (lambda c: (setattr(c.model.lora, "r", 4), setattr(c.rollout, "lora_sync", "adapter"),
                setattr(c.rollout, "backend", "vllm")),
     r"rollout.lora_sync=adapter is not served by rollout workers.*rollout.lora_sync=merged"),
])
def test_a_server_run_refuses(change, match):
    cfg = RunConfig(rollout=_rollout("server", 1))
    validate_run(cfg)
    change(cfg)
    with pytest.raises(ConfigError, match=match):
        validate_run(cfg)
    cfg.rollout.placement = "colocated"  # the same settings are fine colocated
    validate_run(cfg)


def test_worker_addresses_are_host_and_port():
    from arlopti.config.rules import worker_address

    assert worker_address("127.0.0.1:8100") == ("127.0.0.1", 8100)
    assert worker_address("http://gpu7:8100/") == ("gpu7", 8100) and worker_address("[::1]:80") == ("::1", 80)
    assert [worker_address(u) for u in ("localhost", "h:0", "h:65536", "ftp://h:1", "a b:1", "")] == [None] * 6


def test_several_ranks_share_the_workers_evenly():
    cfg = RunConfig(rollout=_rollout("server", 1))
    validate_run(cfg, world_size=2)  # spawned: num_workers per rank
    cfg.rollout.server = ServerConfig(spawn=False, urls=["h:8100"])
    validate_run(cfg)
    with pytest.raises(ConfigError, match=r"rollout.server.urls lists 1 worker\(s\) for 2 trainer ranks"):
        validate_run(cfg, world_size=2)
    cfg.rollout.server = ServerConfig(spawn=False, urls=["h:8100", "g:8100"])
    validate_run(cfg, world_size=2)
