"""Launch a test file's ``worker`` on two CPU processes with ``torchrun`` (gloo), once per module.

Each 2-rank test file runs itself as ``python -m torch.distributed.run --standalone
--nproc_per_node=2 <file> <out>``; its ``__main__`` block calls its ``worker(out)``. One thread per
rank (the machine has 2 cores), the tokenizers' own threads off, the hubs offline, and ``tests/``
plus ``src/`` importable in the workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def run_two_ranks(script: Path, out: Path, *args: str, timeout_s: int = 600) -> subprocess.CompletedProcess:
    """Run ``script out *args`` on 2 ranks and return the finished launch, whatever its exit status (a
    test that kills a rank expects a failure)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(out),
           *args]
    return subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=timeout_s)


def launch_two_ranks(script: Path, out: Path, done_file: str, timeout_s: int = 600, args: tuple[str, ...] = ()) -> Path:
    """Run ``script out *args`` on 2 ranks; fail the test with the output's tails unless it exits 0 and
    leaves ``out/done_file`` (written last by the worker, so a crash after the fact is caught)."""
    proc = run_two_ranks(script, out, *args, timeout_s=timeout_s)
    if proc.returncode != 0 or not (out / done_file).exists():
        pytest.fail(f"2-rank worker of {script.name} failed (rc={proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return out
