"""Overhead of ``TokenDiagnosticsCallback`` on a real training step (SmolLM2-135M-Instruct, CPU).

    python benchmarks/bench_diagnostics.py [--quick] [--prompts 4 --group-size 4 --max-new-tokens 96]
    python benchmarks/bench_diagnostics.py --smoke    # the tiny model, one step per mode: measures nothing

One batch of K&K rollouts is sampled once (HF engine) and then replayed as the experience of every
step, so every step trains on the same batch (the rollout itself is timed once and reported
separately). Steps run through Lightning with the real ``GRPOModule`` (GRPO, KL 0.001 with the
reference model, AdamW), with the diagnostics callback in one of three modes, interleaved
(off, stats, stats+dir, then rotated) after one untimed warm-up round:

* ``off``: callback disabled;
* ``stats``: the every-step part only (bucket fractions, gradient-mass shares, AR weights);
* ``stats+dir``: plus the update-direction measurement (the extra no-grad forward).

A step's time is wall time from ``on_train_batch_start`` to after the diagnostics callback's
``on_train_batch_end``. Reported: the medians; the overhead of each mode over ``off``; the
overhead **at the default frequency** (stats every step, update direction every
``--every`` = 10 steps): ``(stats − off) + (stats+dir − stats) / every``, as a share of the
``off`` step, and as a share of the step plus its rollout (what a real training step costs).
It is given three ways: from the per-mode medians; paired (the same differences taken within
each round of three back-to-back steps, median over rounds); and from the callback's own timer
(``timing/diagnostics_s``), which measures the callback alone. The step-to-step noise of ``off``
is printed beside them: a difference smaller than it is below what step timing can resolve.
Prints a table and writes ``benchmarks/out/bench_diagnostics.json`` (``--out``). Not a test:
nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


import lightning.pytorch as L
import torch

from _common import format_table, interleaved_order, summarise, write_json

MODES = ("off", "stats", "stats+dir")


class _Slot:
    """A stand-in prompt batch: the learner only reads ``batch.experience``."""

    experience = None


class _Replay(L.Callback):
    """Attach the same experience to every batch and set the diagnostics mode of each step."""

    def __init__(self, exp, diag, schedule: list[str]):
        self.exp, self.diag, self.schedule = exp, diag, schedule
        self.step = 0
        self.t0 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        batch.experience = self.exp
        mode = self.schedule[self.step]
        self.diag.enabled = mode != "off"
        self.diag.every_n_steps = 1
        self.diag.update_direction_every_n_steps = 1 if mode == "stats+dir" else None
        self.t0 = time.perf_counter()


class _Timer(L.Callback):
    """Placed after the diagnostics callback: records each step's wall time and mode."""

    def __init__(self, replay: _Replay, diag):
        self.replay, self.diag = replay, diag
        self.rows: list[tuple[str, float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        mode = self.replay.schedule[self.replay.step]
        own = self.diag.last_metrics.get("timing/diagnostics_s", 0.0) if mode != "off" else 0.0
        self.rows.append((mode, time.perf_counter() - self.replay.t0, own))
        self.diag.last_metrics = {}
        self.replay.step += 1


def build(args):
    from arlopti.callbacks.diagnostics import TokenDiagnosticsCallback
    from arlopti.analysis.inputs import load_policy, sample_kk_batch
    from arlopti.config import AlgorithmConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig, SizesConfig
    from arlopti.learner.module import GRPOModule

    n = args.prompts * args.group_size
    cfg = RunConfig(algorithm=AlgorithmConfig(),
                    sizes=SizesConfig(prompts_per_step=args.prompts, group_size=args.group_size, mini_batch_size=n,
                                      micro_batch_size=args.micro_batch, logprob_micro_batch_size=args.logprob_micro_batch),
                    optim=OptimConfig(lr=1e-6), model=ModelConfig(name_or_path=args.model),
                    rollout=RolloutConfig(temperature=0.7, max_new_tokens=args.max_new_tokens))
    loaded = load_policy(args.model, args.cold_start_steps)
    t0 = time.perf_counter()
    batch = sample_kk_batch(loaded, args.prompts, args.group_size, args.max_new_tokens, 0.7, seed=0)
    rollout_s = time.perf_counter() - t0
    module = GRPOModule(cfg, tokenizer=loaded.tokenizer)
    module.policy.load_state_dict(loaded.policy.state_dict())  # the (possibly warmed-up) sampled-from weights
    diag = TokenDiagnosticsCallback()
    return module, batch, diag, rollout_s


def run(args) -> dict:
    from lightning.pytorch.loggers import TensorBoardLogger

    torch.set_num_threads(args.threads)
    module, batch, diag, rollout_s = build(args)
    warm = list(MODES)
    schedule = warm + list(interleaved_order(list(MODES), args.repeats))
    module.total_rollout_steps = len(schedule)
    replay = _Replay(batch.to_experience(), diag, schedule)
    timer = _Timer(replay, diag)
    loader = torch.utils.data.DataLoader([_Slot() for _ in schedule], batch_size=None, collate_fn=lambda x: x)
    with tempfile.TemporaryDirectory() as tb:
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=TensorBoardLogger(tb),
                            callbacks=[replay, diag, timer], enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
        trainer.fit(module, train_dataloaders=loader)
    timed = timer.rows[len(warm):]
    steps = {m: summarise([t for mode, t, _ in timed if mode == m]) for m in MODES}
    own = {m: summarise([o for mode, _, o in timed if mode == m]) for m in MODES if m != "off"}
    off, stats, full = (steps[m]["median"] for m in MODES)
    cheap, direction = stats - off, full - stats
    at_default = cheap + direction / args.every
    # Paired: each round runs the three modes back to back, so per-round differences cancel slow
    # drift; their median is the estimate least moved by one slow step.
    rounds = [dict((m, t) for m, t, _ in timed[i:i + len(MODES)]) for i in range(0, len(timed), len(MODES))]
    paired_cheap = statistics.median(r["stats"] - r["off"] for r in rounds)
    paired_dir = statistics.median(r["stats+dir"] - r["stats"] for r in rounds)
    paired_default = paired_cheap + paired_dir / args.every
    # Resolution: how far apart two "off" steps are (median absolute deviation from their median).
    off_times = [t for mode, t, _ in timed if mode == "off"]
    off_mad = statistics.median(abs(t - off) for t in off_times)
    own_default = own["stats"]["median"] + (own["stats+dir"]["median"] - own["stats"]["median"]) / args.every
    return {
        "settings": vars(args), "responses": len(batch), "tokens": int(batch.response_mask.sum()),
        "prompt_len": batch.prompt_len, "rollout_s": rollout_s, "step_s": steps, "callback_own_s": own,
        "overhead_s": {"stats": cheap, "update_direction": direction, "at_default_frequency": at_default,
                       "at_default_frequency_paired": paired_default,
                       "at_default_frequency_own_timer": own_default},
        "overhead_frac_of_step": {"stats": cheap / off, "stats+dir": (full - off) / off,
                                  "at_default_frequency": at_default / off,
                                  "at_default_frequency_paired": paired_default / off,
                                  "at_default_frequency_own_timer": own_default / off},
        "off_step_mad_frac": off_mad / off,
        "overhead_frac_of_step_plus_rollout": {"at_default_frequency": at_default / (off + rollout_s),
                                               "at_default_frequency_own_timer": own_default / (off + rollout_s)},
        "raw_steps": [{"mode": m, "step_s": t, "callback_s": o} for m, t, o in timed],
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 prompts x 4, 48 tokens, 5 repeats")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--logprob-micro-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5, help="timed steps per mode (median of these)")
    p.add_argument("--every", type=int, default=10, help="update_direction_every_n_steps of the default config")
    p.add_argument("--cold-start-steps", type=int, default=0,
                   help="sample from the cached SFT-warmed model (timings do not depend on the rewards)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m-instruct", help="or tiny (the random test model)")
    p.add_argument("--smoke", action="store_true",
                   help="the tiny model, 1 prompt x 2, 4 tokens, one timed step per mode: a check that it runs")
    p.add_argument("--out", default="bench_diagnostics.json", help="file name under benchmarks/out/ (or a path)")
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens = 2, 48
    if args.smoke:
        args.model, args.prompts, args.group_size, args.max_new_tokens, args.repeats = "tiny", 1, 2, 4, 1
        args.micro_batch, args.logprob_micro_batch = 2, 2
    res = run(args)
    rows = [{"mode": m, "median step s": res["step_s"][m]["median"], "min": res["step_s"][m]["min"],
             "max": res["step_s"][m]["max"], "n": res["step_s"][m]["n"],
             "callback s": res["callback_own_s"].get(m, {}).get("median", 0.0)} for m in MODES]
    print(format_table(rows, ["mode", "median step s", "min", "max", "n", "callback s"]))
    f = res["overhead_frac_of_step"]
    print(f"\n{res['responses']} responses, {res['tokens']} response tokens, prompt {res['prompt_len']} tokens; "
          f"rollout {res['rollout_s']:.1f}s")
    print(f"overhead of stats: {100 * f['stats']:.2f}% of a step; stats+dir: {100 * f['stats+dir']:.1f}%")
    print(f"at the default frequency (dir every {args.every}): {100 * f['at_default_frequency']:.2f}% of the "
          f"update step (callback's own timer: {100 * f['at_default_frequency_own_timer']:.2f}%), "
          f"{100 * res['overhead_frac_of_step_plus_rollout']['at_default_frequency']:.2f}% of step + rollout")
    paired, noise = 100 * f["at_default_frequency_paired"], 100 * res["off_step_mad_frac"]
    print(f"paired per-round estimate at the default frequency: {paired:.2f}%; "
          f"step-to-step noise of 'off' (median abs. deviation): {noise:.2f}% of a step")
    path = write_json(args.out, res)
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main()
