"""``trainer.precision=auto`` (``arlopti.utils.precision``): bf16-mixed exactly where the device has native
bf16 (CPU flags, CUDA support), 32-true elsewhere, with the reason; other values pass through; the
trainer configs default to it and the entry resolves it before Lightning sees it."""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from arlopti.utils import precision


@pytest.mark.parametrize(("avx512_bf16", "amx", "want"), [(False, False, "32-true"), (True, False, "bf16-mixed"),
                                                           (False, True, "bf16-mixed"), (True, True, "bf16-mixed")])
def test_auto_on_a_cpu_follows_its_bf16_units(monkeypatch, avx512_bf16, amx, want):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    got, why = precision.resolve_precision("auto", "cpu")
    assert got == want
    assert ("neither AVX512-BF16 nor AMX" in why) == (want == "32-true")


def test_auto_on_cuda_follows_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU X")
    for supported, want in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, s=supported: s)
        for acc in ("gpu", "cuda", "auto"):
            assert precision.resolve_precision("auto", acc) == (want, "GPU X " + (
                "supports bf16" if supported else "has no bf16 support"))


def test_other_values_pass_through_and_the_machine_at_hand_gets_an_answer():
    for value in ("32-true", "bf16-mixed", "16-mixed", 32):
        assert precision.resolve_precision(value, "cpu") == (value, None)
    got, why = precision.resolve_precision("auto", "cpu")
    assert got in ("32-true", "bf16-mixed") and why


def test_the_trainer_configs_default_to_auto_and_train_resolves_it(caplog):
    from arlopti.entry.train import trainer_precision
    from helpers.compose import CONFIGS

    for name in ("default", "cpu", "gpu"):
        cfg = OmegaConf.load(CONFIGS / "trainer" / f"{name}.yaml")
        assert cfg.get("precision", "auto") == "auto", name
    with caplog.at_level(logging.INFO, logger="arlopti.entry.train"):
        got = trainer_precision(OmegaConf.create({"precision": "auto", "accelerator": "cpu"}))
    assert got == precision.resolve_precision("auto", "cpu")[0]
    assert f"trainer.precision=auto: {got}, because" in caplog.text
    assert trainer_precision(OmegaConf.create({"precision": "32-true"})) == "32-true"
