"""docs/custom_task.md runs as written: its code blocks, in order, build a custom task from an empty
folder, train it 2 steps and evaluate it, with no file under ``src/`` touched.

How the page is run: every fenced block whose info string carries ``file=PATH`` is written to PATH;
every ``bash`` block is a command; together, in page order, they form one bash script (``set -eu``)
run in a temporary folder. That folder stands for the checkout's root: ``train.py``, ``eval.py`` and
``configs`` are links to this checkout, and ``PROJECT_ROOT`` points at the folder so that the runs'
``logs/`` land there (the one thing the test adds; the commands are the page's).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "custom_task.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


def guide_blocks(text: str) -> list[tuple[str, str, str | None]]:
    """``(language, body, file path or None)`` of every fenced block, in page order."""
    out = []
    for m in FENCE.finditer(text):
        info = m.group(1).split()
        lang = info[0] if info else ""
        path = next((w.split("=", 1)[1] for w in info[1:] if w.startswith("file=")), None)
        out.append((lang, m.group(2), path))
    return out


def guide_script(text: str) -> str:
    """The page's blocks as one bash script: files as quoted heredocs, bash blocks as they are."""
    lines = ["set -eu"]
    for lang, body, path in guide_blocks(text):
        if path is not None:
            assert "ARLOPTI_EOF" not in body
            lines += [f"mkdir -p \"$(dirname '{path}')\"", f"cat > '{path}' <<'ARLOPTI_EOF'", body.rstrip("\n"),
                      "ARLOPTI_EOF"]
        elif lang == "bash":
            lines.append(body)
    return "\n".join(lines) + "\n"


def run_guide(guide: Path, folder: Path, links: tuple[str, ...] = ("configs",)) -> subprocess.CompletedProcess:
    """Run page ``guide`` as one bash script (:func:`guide_script`) in ``folder``, which stands for the checkout's
    root: ``links`` (names at the checkout's root) are linked there and ``PROJECT_ROOT`` points at it. Asserts
    that the script succeeded and returns the finished process."""
    for name in links:
        (folder / name).symlink_to(REPO_ROOT / name)
    env = dict(os.environ, PROJECT_ROOT=str(folder), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (folder / "guide.sh").write_text(guide_script(guide.read_text()))
    proc = subprocess.run(["bash", "guide.sh"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def test_guide_blocks_write_files_outside_src_and_run_train_and_eval():
    blocks = guide_blocks(GUIDE.read_text())
    files = [p for _, _, p in blocks if p]
    assert files == ["my_task/rewards.py", "my_task/train.jsonl", "my_task/val.jsonl"]
    assert not any(Path(p).is_absolute() or Path(p).parts[0] in ("src", "configs") for p in files)
    commands = "\n".join(body for lang, body, _ in blocks if lang == "bash")
    assert "python train.py" in commands and "python eval.py eval=val" in commands and "ckpt_path=last" in commands


def _src_state() -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in (REPO_ROOT / "src").rglob("*") if p.is_file()
            and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_custom_task_guide_runs_as_written(tmp_path):
    before = _src_state()
    proc = run_guide(GUIDE, tmp_path, ("train.py", "eval.py", "configs"))
    assert _src_state() == before  # the task needed no change under src/

    # preview: the two training prompts, rendered by the chat template, with their answers and columns
    fed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"uid"')]
    assert [r["ground_truth"] for r in fed] == ["5", "8"]
    assert fed[0]["uid"] == "custom/my_task/train/0" and fed[0]["meta"]["level"] == 1
    assert "What is 2 + 3?" in fed[0]["prompt_text"]
    # training: 2 rollout steps, a checkpoint; validation on val.jsonl with the custom reward
    ckpts = list((tmp_path / "logs" / "my_task").glob("*/*/checkpoints/last.ckpt"))
    assert len(ckpts) == 1
    # eval: the custom task on the val file, from that checkpoint
    (report_path,) = (tmp_path / "logs" / "eval" / "val").glob("*/eval_results.json")
    report = json.loads(report_path.read_text())
    assert report["model"] == str(ckpts[0])
    assert report["metrics"]["val/custom/val/greedy/acc"] in (0.0, 0.5, 1.0)  # 2 prompts, greedy
    assert [(s["name"], s["problems"]) for s in report["sets"]] == [("val", 2)]
