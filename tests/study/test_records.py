"""What the study records names no machine path (issue 51): its commands are written with paths relative to the
checkout (``portable_command``), and nothing under docs/figures/ holds an absolute path."""

from __future__ import annotations

import re
from pathlib import Path

from arlopti.study.__main__ import portable_command, portable_path

REPO = Path(__file__).resolve().parents[2]
ABSOLUTE = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|Users|mnt|scratch|data)/")


def test_paths_inside_the_checkout_become_relative_and_others_a_placeholder(tmp_path):
    root = tmp_path / "repo"
    (root / "logs" / "study").mkdir(parents=True)
    inside, outside = root / "logs" / "study" / "toy", tmp_path / "elsewhere" / "toy"
    words = ["arlopti", "study", "toy", "--out", str(inside), "--seeds", "20"]
    assert portable_command(words, root) == "arlopti study toy --out logs/study/toy --seeds 20"
    assert portable_command(["study", f"--out={outside}"], root) == "study --out=<path>"
    assert portable_path("logs/study/kk", root) == "logs/study/kk" and portable_path("20", root) == "20"
    assert portable_path(str(root), root) == "."


def test_no_file_under_docs_figures_names_a_machine_path():
    found = [str(p.relative_to(REPO)) for p in sorted((REPO / "docs" / "figures").rglob("*"))
             if p.suffix in (".json", ".md", ".txt") and ABSOLUTE.search(p.read_text())]
    assert not found, f"machine paths in {found}"
