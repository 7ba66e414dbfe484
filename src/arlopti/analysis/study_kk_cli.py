"""The options of ``study kk-mechanism``, ``study kk-run`` and ``study kk-report`` (:mod:`.study_kk`)."""

from __future__ import annotations


def add_kk_args(sub) -> None:
    m = sub.add_parser("kk-mechanism", help="every method's first update on the same SmolLM2 K&K batches")
    m.add_argument("--out", default="study_out/kk")
    m.add_argument("--methods", default=None, help="comma list of experiment names (default: all)")
    m.add_argument("--model", default="smollm2-135m-instruct")
    m.add_argument("--batches", type=int, default=3, help="batches measured by this call")
    m.add_argument("--first-batch", type=int, default=0, help="index of the first (its sampling seed)")
    m.add_argument("--prompts", type=int, default=2, help="K&K prompts per batch")
    m.add_argument("--group-size", type=int, default=4)
    m.add_argument("--max-new-tokens", type=int, default=64)
    m.add_argument("--temperature", type=float, default=0.7)
    m.add_argument("--micro-batch", type=int, default=8)
    m.add_argument("--threads", type=int, default=None)
    r = sub.add_parser("kk-run", help="one learning-pilot run: train.py experiment=kk_lopti_demo, then eval.py")
    r.add_argument("--out", default="study_out/kk")
    r.add_argument("--method", required=True, help="experiment name kk_<method>")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--val-per-n", type=int, default=32, help="validation puzzles per N (2 and 3 people)")
    r.add_argument("--keep-checkpoint", action="store_true", help="keep the run's last.ckpt after the evaluation")
    r.add_argument("--threads", type=int, default=None)
    p = sub.add_parser("kk-report", help="tables and figures of the K&K mechanism and pilot in --out")
    p.add_argument("--out", default="study_out/kk")
    p.add_argument("--threads", type=int, default=None)
