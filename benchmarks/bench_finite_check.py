"""Cost of the post-step weight finiteness check on SmolLM2-135M-Instruct (CPU, fp32).

    python benchmarks/bench_finite_check.py [--repeats 7] [--batch 2] [--tokens 128]
    python benchmarks/bench_finite_check.py --smoke    # the tiny model, one round: measures nothing

After every optimizer step the learner checks that the updated parameters are finite
(:func:`arlopti.learner.guard.tensors_finite`, then ``bool()``; on CPU one sum per tensor, a
non-finite sum confirmed by ``torch._foreach_norm(ord=inf)``; on CUDA that fused max-abs reduction
directly), issue 14. This times that check alone against the optimizer update it follows,
alternating (update, check, update, check, ...) after one untimed warm-up round:

* ``update``: one optimizer step as the learner takes it: zero grads, forward + backward of
  ``--batch`` × ``--tokens`` tokens, global-norm clipping, ``AdamW.step()`` (the project's
  ``build_optimizer`` with the default ``OptimConfig``); its ``AdamW.step()`` part is also
  reported on its own (``opt_step``), the smallest update a check can follow;
* ``check``: ``bool(tensors_finite(trainable parameters))``, right after the update (as in
  ``GRPOModule._step_or_skip``).

Reports medians over ``--repeats`` (>= 5) and the check as a share of the update and of
``AdamW.step()``; writes ``benchmarks/out/bench_finite_check.json`` (``--out``). Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from _common import summarise, write_json


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="or tiny (the random test model)")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, 1 x 8 tokens, one round: a check that it runs")
    ap.add_argument("--out", default="bench_finite_check.json", help="file name under benchmarks/out/ (or a path)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.batch, args.tokens, args.repeats = "tiny", 1, 8, 1
    elif args.repeats < 5:
        ap.error("--repeats must be >= 5")
    torch.set_num_threads(args.threads)

    from arlopti.config import OptimConfig
    from arlopti.learner.guard import tensors_finite
    from arlopti.learner.optim import build_optimizer
    from arlopti.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(args.model, load_tokenizer(args.model), dtype="float32")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    opt, _ = build_optimizer(params, OptimConfig())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.tokens), generator=g)

    def update() -> tuple[float, float]:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1

    def check() -> float:
        t0 = time.perf_counter()
        ok = bool(tensors_finite(params))
        t = time.perf_counter() - t0
        assert ok
        return t

    update(), check()  # warm-up: allocates Adam's moments, first-touch pages
    samples = {"update": [], "opt_step": [], "check": []}
    for _ in range(args.repeats):
        total, step = update()
        samples["update"].append(total)
        samples["opt_step"].append(step)
        samples["check"].append(check())
    med = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "params": n_params, "batch": args.batch, "tokens": args.tokens, "threads": args.threads,
        "repeats": args.repeats, "samples_s": samples, "summary": {k: summarise(v) for k, v in samples.items()},
        "check_over_update": med["check"] / med["update"], "check_over_opt_step": med["check"] / med["opt_step"],
    }
    path = write_json(args.out, result)
    print(f"{args.model}, {n_params:,} trainable parameters (fp32), batch {args.batch} x {args.tokens} "
          f"tokens, {args.threads} threads, n = {args.repeats} alternating")
    print(f"  update (fwd+bwd+clip+AdamW.step): median {med['update'] * 1e3:9.1f} ms")
    print(f"  of which AdamW.step():            median {med['opt_step'] * 1e3:9.1f} ms")
    print(f"  finiteness check:                 median {med['check'] * 1e3:9.1f} ms")
    print(f"  check / update = {result['check_over_update']:.2%}; check / AdamW.step = "
          f"{result['check_over_opt_step']:.2%}")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
