"""The commands of ``python -m arlopti.analysis`` (each a function of the parsed arguments, returning
its result dict): :mod:`arlopti.analysis.__main__` parses and dispatches, ``reproduce`` calls them in turn.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path


from arlopti.analysis.cli_args import DEFAULT_LR, fill_method_args

log = logging.getLogger("arlopti.analysis")


def load_inputs(args):
    """``(loaded policy, batch, old log-probs)`` for a command (module docstring)."""
    from arlopti.analysis.inputs import batch_from_dump, load_policy, sample_kk_batch
    from arlopti.analysis.updates import sampled_log_probs

    loaded = load_policy(args.model, args.cold_start_steps)
    if args.dump:
        tok = loaded.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        batch = batch_from_dump(args.dump, args.temperature, args.dump_step, args.advantages, args.seed, pad)
        batch.info["model_info"] = loaded.info
    else:
        batch = sample_kk_batch(loaded, args.prompts, args.group_size, args.max_new_tokens, args.temperature,
                                args.seed, args.num_people, args.puzzle_seed, args.advantages)
    old = sampled_log_probs(loaded.policy, batch, args.micro_batch)
    return loaded, batch, old


def caption(batch, extra: str = "") -> str:
    """One line naming the model, the batch and the advantage source (printed under every figure)."""
    mi = batch.info.get("model_info", {})
    s = batch.summary()
    text = (f"{mi.get('model', '?')}, cold start {mi.get('cold_start_steps', 0)} SFT steps; {s['responses']} "
            f"responses ({s['prompts']} prompts), {s['tokens']} tokens, T={batch.temperature}; "
            f"reward mean {s['reward_mean']:.2f}; advantages: {batch.advantage_source}")
    if batch.advantage_source != "grpo":
        text += " (SYNTHETIC)"
    return text + (f"; {extra}" if extra else "")


def _lr(args) -> float:
    return args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]


# ------------------------------------------------------------------------------------------- commands
def cmd_grad_norms(args, inputs=None, bank=None) -> dict:
    from arlopti.analysis.grad_norms import (aggregate_grad_norms, default_layer, per_token_grad_norms,
                                             summarise_per_token)
    from arlopti.analysis.plotting import plot_grad_norm_medians, plot_grad_norms, save_result

    loaded, batch, old = inputs or load_inputs(args)
    layer = default_layer(loaded.policy) if args.layer is None else args.layer
    result: dict = {"batch": batch.summary(), "advantage_source": batch.advantage_source,
                    "temperature": batch.temperature}
    t0 = time.perf_counter()
    if args.mode in ("per-token", "both"):
        recs = per_token_grad_norms(loaded.policy, batch, old, args.max_tokens, args.max_sequences, layer, args.seed)
        result["per_token"] = {"summary": summarise_per_token(recs, layer), "records": recs,
                               "max_tokens": args.max_tokens, "max_sequences": args.max_sequences}
    t1 = time.perf_counter()
    if args.mode in ("aggregate", "both"):
        result["aggregate"] = aggregate_grad_norms(loaded.policy, batch, old, args.micro_batch, bank)
    result["seconds"] = {"per_token": t1 - t0, "aggregate": time.perf_counter() - t1}
    per_token_note = "per-token mode needs no advantage" if "per_token" in result else ""
    result["caption"] = caption(batch, per_token_note)
    extra = {"grad_norms_by_bucket": plot_grad_norm_medians(result)} if "per_token" in result else {}
    result["files"] = save_result(args.out, "grad_norms", result, plot_grad_norms(result), args.tb_dir, extra)
    return result


def cmd_token_distribution(args, inputs=None) -> dict:
    from arlopti.plugins.buckets import token_distribution
    from arlopti.analysis.plotting import plot_token_distribution, save_result

    loaded, batch, old = inputs or load_inputs(args)
    result = token_distribution(old.exp(), batch.advantages, batch.response_mask)
    result.update(batch=batch.summary(), advantage_source=batch.advantage_source, caption=caption(batch))
    result["files"] = save_result(args.out, "token_distribution", result, plot_token_distribution(result),
                                  args.tb_dir)
    return result


def cmd_prob_shift(args, inputs=None, bank=None) -> dict:
    from arlopti.analysis.plotting import plot_prob_shift, save_result
    from arlopti.analysis.prob_shift import prob_shift

    loaded, batch, old = inputs or load_inputs(args)
    t0 = time.perf_counter()
    result = prob_shift(loaded.policy, batch, args.optimizer, _lr(args), args.grad_clip, args.micro_batch, old, bank)
    result.update(batch=batch.summary(), seconds=time.perf_counter() - t0,
                  caption=caption(batch, f"{args.optimizer} lr {_lr(args):g}"))
    result["files"] = save_result(args.out, f"prob_shift_{args.optimizer}", result, plot_prob_shift(result),
                                  args.tb_dir)
    return result


def cmd_update_direction(args, inputs=None, first_grads=None) -> dict:
    from arlopti.analysis.plotting import plot_update_direction, save_result
    from arlopti.analysis.update_direction import update_direction

    fill_method_args(args)
    loaded, batch, old = inputs or load_inputs(args)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    t0 = time.perf_counter()
    result = update_direction(loaded.policy, batch, methods, args.alpha, args.eta, args.optimizer, _lr(args),
                              args.grad_clip, args.micro_batch, old, first_grads)
    result.update(batch=batch.summary(), seconds=time.perf_counter() - t0,
                  caption=caption(batch, f"{args.optimizer} lr {_lr(args):g}"))
    result["files"] = save_result(args.out, f"update_direction_{args.optimizer}", result,
                                  plot_update_direction(result), args.tb_dir)
    return result


def write_live_dump(batch, old_log_probs, path: str | Path) -> Path:
    """Write a sampled batch as a rollout dump (schema of :mod:`arlopti.learner.rollout_dump`)."""
    from arlopti.learner.rollout_dump import step_records, write_records
    from arlopti.learner.step_context import StepContext

    exp = batch.to_experience()
    ctx = StepContext(exp, old_log_probs, batch.advantages, batch.advantages, [], {})
    return write_records(path, step_records(ctx, step=0))


def cmd_dump(args) -> dict:
    loaded, batch, old = load_inputs(args)
    path = Path(args.file or Path(args.out) / "rollouts_live.jsonl.gz")
    write_live_dump(batch, old, path)
    return {"file": str(path), "batch": batch.summary()}


def cmd_word_categories(args, texts_rewards=None, source: str | None = None) -> dict:
    from arlopti.analysis.plotting import plot_word_categories, save_result
    from arlopti.analysis.word_categories import PAPER_SIGNS, correlate

    if texts_rewards is None:
        if args.dump:
            from arlopti.learner.rollout_dump import read_dump

            rows = read_dump(args.dump)
            texts_rewards = ([r["completion"] for r in rows], [r["reward"] for r in rows])
            source = f"dump {args.dump}"
        else:
            _, batch, _ = load_inputs(args)
            texts_rewards = (batch.response_texts, batch.rewards.tolist())
            source = "live batch"
    result = correlate(*texts_rewards)
    result["source"] = source
    result["paper_signs"] = PAPER_SIGNS
    result["agrees_with_paper_sign"] = {
        c: (None if v["r_rate"] is None else (v["r_rate"] > 0) == (PAPER_SIGNS[c] > 0))
        for c, v in result["categories"].items()}
    result["caption"] = f"{source}; {result['responses']} responses; rewards {result['reward_values']}"
    result["files"] = save_result(args.out, "word_categories", result, plot_word_categories(result, PAPER_SIGNS),
                                  args.tb_dir)
    return result


def cmd_compare_methods(args, inputs=None) -> dict:
    from arlopti.analysis.compare_methods import METHODS, compare_methods, markdown_table, plot_compare_methods
    from arlopti.analysis.plotting import save_result
    from arlopti.config import TokenMethodConfig

    fill_method_args(args)
    loaded, batch, old = inputs or load_inputs(args)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip()) if args.methods else METHODS
    t0 = time.perf_counter()
    result = compare_methods(loaded.policy, batch, methods, args.alpha, args.eta, args.optimizer, _lr(args),
                             args.micro_batch, old, TokenMethodConfig(cov_ratio=args.cov_ratio))
    result.update(batch=batch.summary(), seconds=time.perf_counter() - t0,
                  caption=caption(batch, f"{args.optimizer} lr {_lr(args):g}"))
    result["table_high_bucket"] = markdown_table(result)
    result["files"] = save_result(args.out, f"compare_methods_{args.optimizer}", result, plot_compare_methods(result),
                                  args.tb_dir)
    print(result["table_high_bucket"])
    return result
