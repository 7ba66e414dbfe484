"""benchmarks/gpu_check.sh and its GPU parts, on CPU: the header states the device command, its
carry list and timeout; each part's ``--dry-run`` runs every step a CPU can (no CUDA verdicts).
The whole check in a fresh venv holding only the GPU image's packages is in the issue-23 note
(it needs PyPI for --prepare, which tests never touch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts a process (make test-fast leaves them out)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def test_the_header_states_the_run_command_carry_list_and_timeout_and_the_parts_fit_in_it():
    text = SCRIPT.read_text()
    m = re.search(r'run\(command="bash benchmarks/gpu_check.sh", carry=\["\.gpu_check"\], timeout_s=(\d+)\)', text)
    assert m, "the header must give the exact device command"
    timeout = int(m.group(1))
    parts = [int(t) for t in re.findall(r"^part \w+ (\d+) ", text, flags=re.M)]
    fsdp = re.search(r'^part fsdp "\$\(\[\[ -n "\$DRY" \]\] && echo \d+ \|\| echo (\d+)\)"', text, flags=re.M)
    total = sum(parts) + int(fsdp.group(1))
    assert total + 60 <= timeout <= 10 * 60, (parts, total, timeout)  # setup margin; the device's 10 min a command
    assert "/.gpu_check/" in (REPO / ".gitignore").read_text()
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("script,report", [("gpu_check_kernels.py", "gpu_check_kernels.json"),
                                           ("gpu_check_learner.py", "gpu_check_learner.json"),
                                           ("gpu_check_fsdp.py", "gpu_check_fsdp.json")])
def test_each_gpu_part_dry_runs_on_cpu(script, report, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--dry-run", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^GPU CHECK \w+: PASS", proc.stdout, flags=re.M), proc.stdout[-2000:]
    data = json.loads((tmp_path / report).read_text())
    assert data["ok"] is True
