"""``trainer.precision=auto`` (``arlopti.utils.precision``): bf16-mixed only where the device has native bf16
(CPU flags, CUDA support), bf16-mixed is known to learn like fp32 (``BF16_LEARNS_LIKE_FP32``) and, on a CPU,
its bf16 GEMM measured at least ``MIN_BF16_GEMM_SPEEDUP`` times fp32's; the rates are measured once per
machine and cached; other values pass through; the trainer configs default to it and the entry resolves it
(logging the choice and the rates) before Lightning sees it. Every measurement here is injected: no test
depends on how fast this machine is."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from omegaconf import OmegaConf

from arlopti.utils import precision

FAST = {"fp32_gflops": 187.0, "bf16_gflops": 405.0}  # the AVX512-BF16 EPYC: 2.2x
SLOW = {"fp32_gflops": 187.0, "bf16_gflops": 200.0}  # 1.07x: below MIN_BF16_GEMM_SPEEDUP


def never_measured():
    raise AssertionError("the GEMM rates were measured where they must not be")


def cpu_flags(monkeypatch, avx512_bf16: bool, amx: bool = False) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize(("avx512_bf16", "amx", "want"), [(False, False, "32-true"), (True, False, "bf16-mixed"),
                                                           (False, True, "bf16-mixed"), (True, True, "bf16-mixed")])
def test_auto_on_a_fast_cpu_follows_its_bf16_units(monkeypatch, tmp_path, avx512_bf16, amx, want):
    cpu_flags(monkeypatch, avx512_bf16, amx)
    measure = (lambda: FAST) if want == "bf16-mixed" else never_measured  # no native bf16: nothing measured
    got, why = precision.resolve_precision("auto", "cpu", tmp_path / "rates.json", measure, learns_like_fp32=True)
    assert got == want
    assert ("neither AVX512-BF16 nor AMX" in why) == (want == "32-true")
    if want == "bf16-mixed":
        assert "bf16 405.0 GFLOP/s, fp32 187.0" in why and "2.17x" in why


def test_auto_keeps_fp32_where_bf16_gemm_is_not_faster_enough(monkeypatch, tmp_path):
    cpu_flags(monkeypatch, True)
    got, why = precision.resolve_precision("auto", "cpu", tmp_path / "rates.json", lambda: SLOW, learns_like_fp32=True)
    assert got == "32-true" and "1.07x" in why and f"from {precision.MIN_BF16_GEMM_SPEEDUP}x" in why


def test_auto_keeps_fp32_until_bf16_learns_like_fp32_and_still_reports_the_rates(monkeypatch, tmp_path):
    cpu_flags(monkeypatch, True)
    got, why = precision.resolve_precision("auto", "cpu", tmp_path / "r.json", lambda: FAST, learns_like_fp32=False)
    assert got == "32-true" and "BF16_LEARNS_LIKE_FP32" in why and "bf16 405.0 GFLOP/s, fp32 187.0" in why
    for setting, want in ((False, "32-true"), (True, "bf16-mixed")):  # the default follows the module's setting
        monkeypatch.setattr(precision, "BF16_LEARNS_LIKE_FP32", setting)
        assert precision.resolve_precision("auto", "cpu", tmp_path / "r.json", never_measured)[0] == want  # cached


def test_the_rates_are_measured_once_per_machine_and_cached(monkeypatch, tmp_path):
    path, calls = tmp_path / "sub" / "rates.json", []
    measure = lambda: calls.append(1) or dict(FAST)  # noqa: E731
    assert precision.cached_gemm_rates(path, "cpu A | torch 1", measure) == (FAST, False)
    assert precision.cached_gemm_rates(path, "cpu A | torch 1", never_measured) == (FAST, True)
    assert precision.cached_gemm_rates(path, "cpu B | torch 1", lambda: SLOW) == (SLOW, False)  # another machine
    assert json.loads(path.read_text()) == {"cpu A | torch 1": FAST, "cpu B | torch 1": SLOW}
    assert calls == [1]
    path.write_text("{not json")  # unreadable: measured again and written over
    assert precision.cached_gemm_rates(path, "cpu A | torch 1", measure) == (FAST, False)
    assert json.loads(path.read_text()) == {"cpu A | torch 1": FAST}
    path.write_text(json.dumps({"cpu A | torch 1": {"fp32_gflops": 0}}))  # not a rate: measured again
    assert precision.cached_gemm_rates(path, "cpu A | torch 1", measure)[1] is False
    assert precision.cached_gemm_rates(None, "k", lambda: SLOW) == (SLOW, False)  # no file: nothing kept


def test_a_cache_that_cannot_be_written_is_logged_and_the_rates_used(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="arlopti.utils.precision"):
        assert precision.cached_gemm_rates(blocker / "rates.json", "k", lambda: FAST) == (FAST, False)
    assert "could not cache the GEMM rates" in caplog.text


def test_the_cache_key_names_the_cpu_model_and_torch():
    key = precision.machine_key()
    assert torch.__version__ in key and key.split(" | ")[0]


def test_auto_on_cuda_follows_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU X")
    for supported, want in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, s=supported: s)
        for acc in ("gpu", "cuda", "auto"):
            assert precision.resolve_precision("auto", acc, measure=never_measured, learns_like_fp32=True) == (
                want, "GPU X " + ("supports bf16" if supported else "has no bf16 support"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a: True)
    got, why = precision.resolve_precision("auto", "gpu", measure=never_measured, learns_like_fp32=False)
    assert got == "32-true" and "BF16_LEARNS_LIKE_FP32" in why


def test_other_values_pass_through():
    for value in ("32-true", "bf16-mixed", "16-mixed", 32):
        assert precision.resolve_precision(value, "cpu", measure=never_measured) == (value, None)


def test_the_trainer_configs_default_to_auto_and_train_resolves_it(monkeypatch, tmp_path, caplog):
    from arlopti.entry.train import trainer_precision
    from helpers.compose import CONFIGS

    for name in ("default", "cpu", "gpu"):
        cfg = OmegaConf.load(CONFIGS / "trainer" / f"{name}.yaml")
        assert cfg.get("precision", "auto") == "auto", name
    monkeypatch.setenv("ARLOPTI_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "measure_gemm_rates", lambda: FAST)
    monkeypatch.setattr(precision, "BF16_LEARNS_LIKE_FP32", True)
    cpu_flags(monkeypatch, True)
    with caplog.at_level(logging.INFO, logger="arlopti.entry.train"):
        got = trainer_precision(OmegaConf.create({"precision": "auto", "accelerator": "cpu"}))
    assert got == "bf16-mixed"
    assert "trainer.precision=auto: bf16-mixed, because" in caplog.text and "bf16 405.0 GFLOP/s" in caplog.text
    assert json.loads((tmp_path / precision.RATES_FILE).read_text()) == {precision.machine_key(): FAST}
    assert trainer_precision(OmegaConf.create({"precision": "32-true"})) == "32-true"
