"""README's demo table, generated from the demo's recorded summary (``docs/demo_summary.json``).

``make demo`` (``python train.py experiment=kk_lopti_demo``) writes ``summary.json`` in its run
folder (:class:`arlopti.callbacks.summary.TrainingSummary`). Record it, with the wall time, and
regenerate README's table::

    python -m arlopti.entry.demo_record record logs/kk_lopti_demo/<run>/<time>/summary.json --wall "11 min 26 s"
    python -m arlopti.entry.demo_record check      # exit 1 when README's table is not the recorded one

The table sits in README between ``<!-- demo-table:start -->`` and ``<!-- demo-table:end -->``;
``tests/entry/test_demo_record.py`` fails when it differs from :func:`render_table` of the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arlopti.config.cli_report import run_command

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "docs" / "demo_summary.json"
README = ROOT / "README.md"
START, END = "<!-- demo-table:start -->", "<!-- demo-table:end -->"
TRAIN_KEYS = ("reward/mean", "reward/format_ok", "reward/accuracy", "rollout/response_len_mean")


def record_from_summary(summary: dict, wall: str | None = None) -> dict:
    """The numbers README shows, from a run's ``summary.json``."""
    val = {}
    for when, ev in (("before", summary.get("eval_first") or {}), ("after", summary.get("eval_last") or {})):
        val[when] = {k.replace("val/kk/", "").replace("/greedy/", "/"): float(v) for k, v in ev.items()
                     if k.startswith("val/kk/") and "/greedy/" in k}
        val[when]["rollout_step"] = int(ev.get("rollout_step", 0))
    return {"command": "python train.py experiment=kk_lopti_demo", "wall": wall,
            "rollout_steps": summary.get("rollout_steps"), "optimizer_steps": summary.get("optimizer_steps"),
            "train_first": {k: float(summary["start"][k]) for k in TRAIN_KEYS if k in summary.get("start", {})},
            "train_last": {k: float(summary["end"][k]) for k in TRAIN_KEYS if k in summary.get("end", {})},
            "val": val, "phase_seconds": summary.get("phase_seconds"), "machine": summary.get("machine")}


#: The machine class the demo's time goal is stated for (issue 43: <= 5 min of train.py at this fp32 GEMM rate).
REFERENCE_GFLOPS = 180.0


def time_line(rec: dict) -> str:
    """Where the recorded run's time went and on what machine, with its total scaled to the reference
    GEMM rate (:data:`REFERENCE_GFLOPS`): ``total x own rate / reference``. Empty for an older record."""
    phases, mach = rec.get("phase_seconds"), rec.get("machine")
    if not phases or not mach or phases.get("total") is None:
        return ""
    names = (("start_up", "start-up"), ("cold_start", "cold start"), ("evaluations", "2 greedy evaluations"),
             ("rollout", "rollout"), ("update", "update"), ("other", "other"))
    parts = ", ".join(f"{label} {phases[k]:.0f} s" for k, label in names if phases.get(k) is not None)
    scaled = phases["total"] * mach["gemm_fp32_gflops"] / REFERENCE_GFLOPS
    return (f" Where it went: {parts}. Machine: {mach['cpu']}, {mach['cores']} cores, fp32 GEMM "
            f"{mach['gemm_fp32_gflops']:.0f} GFLOP/s; scaled to {REFERENCE_GFLOPS:.0f} GFLOP/s the run takes "
            f"{scaled / 60:.1f} min.")


def _n(v: float, digits: int = 2) -> str:
    return f"{v:.{digits}f}".replace("-", "−")


def render_table(rec: dict) -> str:
    """README's markdown table of a record (:func:`record_from_summary`)."""
    f, l, b, a = rec["train_first"], rec["train_last"], rec["val"]["before"], rec["val"]["after"]
    sets = sorted(k.split("/")[0] for k in b if k.endswith("/acc") and not k.startswith("mean"))
    per_set = " / ".join(s.replace("kk_", "").replace("ppl", "") for s in sets)

    def accs(v):
        return f"{_n(v['mean/acc'], 3)} ({' / '.join(_n(v[f'{s}/acc'], 3) for s in sets)})"

    rows = ["| | first 3 GRPO steps (mean) | last 3 GRPO steps (mean) |", "| --- | --- | --- |",
            f"| train reward (3 correct, −3 no format) | {_n(f['reward/mean'])} | {_n(l['reward/mean'])} |",
            f"| train format rate | {_n(f['reward/format_ok'])} | {_n(l['reward/format_ok'])} |",
            f"| train accuracy | {_n(f['reward/accuracy'])} | {_n(l['reward/accuracy'])} |",
            f"| response length (tokens) | {f['rollout/response_len_mean']:.0f} | {l['rollout/response_len_mean']:.0f} |",
            f"| **validation, greedy** | before GRPO | after {rec['rollout_steps']} steps |",
            f"| reward / format rate | {_n(b['mean/reward'])} / {_n(b['mean/format_rate'])} | "
            f"{_n(a['mean/reward'])} / {_n(a['mean/format_rate'])} |",
            f"| accuracy (mean; {per_set} people) | {accs(b)} | {accs(a)} |"]
    tail = (f"\n\n`{rec['command']}` ran {rec['rollout_steps']} rollout steps and {rec['optimizer_steps']} optimizer "
            "steps" + (f" in {rec['wall']} (wall time of train.py alone, the venv already installed)"
                                 if rec.get("wall") else "") + "." + time_line(rec))
    return "\n".join(rows) + tail


def readme_table(text: str) -> str:
    """The table between the README markers (ValueError without them)."""
    if START not in text or END not in text:
        raise ValueError(f"README has no {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def write_readme(rec: dict, readme: Path = README) -> None:
    text = readme.read_text()
    old = readme_table(text)
    readme.write_text(text.replace(f"{START}\n{old}\n{END}", f"{START}\n{render_table(rec)}\n{END}"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arlopti.entry.demo_record", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record a demo run's summary.json and regenerate README's table")
    r.add_argument("summary")
    r.add_argument("--wall", default=None, help="the measured wall time, e.g. '11 min 26 s'")
    sub.add_parser("check", help="exit 1 when README's table is not the recorded one")
    args = p.parse_args(argv)
    if args.cmd == "record":
        rec = record_from_summary(json.loads(Path(args.summary).read_text()), args.wall)
        RECORD.write_text(json.dumps(rec, indent=2) + "\n")
        write_readme(rec)
        print(f"wrote {RECORD} and README's demo table")
        return 0
    want = render_table(json.loads(RECORD.read_text()))
    if readme_table(README.read_text()) != want:
        print(f"README's demo table differs from {RECORD}; run `python -m arlopti.entry.demo_record record ...`:\n{want}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
