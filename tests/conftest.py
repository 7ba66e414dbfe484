"""Shared fixtures: a tokenizer trained in-process, tiny random models, the shared data dir."""

from __future__ import annotations

import os
from pathlib import Path

# Under pytest-xdist (`make test` runs 2 workers on 2 cores) OpenMP's spinning waits make two
# torch processes sharing the cores 4x slower each (45 s alone, 192 s side by side, measured on
# tests/learner/test_multiturn_learning.py); passive waits give 60 s side by side. It must be set
# before torch loads libgomp; the tests' subprocesses (train.py, ranks, rollout workers) inherit it.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ARLOPTI_SHARED", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures"

torch.set_num_threads(min(2, os.cpu_count() or 1))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


HEAVY_MARKS = ("slow", "vllm", "distributed")
#: `make test-fast` sets this: a test that starts a process (a subprocess, a fork, a worker pool, a
#: sandbox) then fails, naming the mark that leaves it out of the edit-test loop.
NO_PROCESSES = os.environ.get("ARLOPTI_NO_PROCESSES") == "1"


def pytest_collection_modifyitems(config, items):
    """Files holding a slow, vLLM or multi-process test run first (a stable sort: the order inside each
    group stays). `make test` hands whole files to two workers in collection order (--dist loadfile
    --no-loadscope-reorder; xdist's own reorder, by test count, would start the few-test multi-minute
    files last): long files first leave short ones to even out the two workers' ends."""
    heavy = {item.path for item in items if any(item.get_closest_marker(m) for m in HEAVY_MARKS)}
    items.sort(key=lambda item: item.path not in heavy)


@pytest.fixture(autouse=True)
def _no_process_in_the_fast_loop(request, monkeypatch):
    """Under ``ARLOPTI_NO_PROCESSES=1`` (``make test-fast``), starting a process fails the test: the fast
    loop starts none. Installed per test, inside the xdist worker, so pytest's own workers still start."""
    if not NO_PROCESSES:
        return
    import multiprocessing.process
    import subprocess

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.process "
                           "(make test-fast leaves those out)")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)


def need_fixture(rel: str) -> Path:
    """Return ``FIXTURES/rel`` or skip the test with the reason."""
    path = FIXTURES / rel
    if not path.exists():
        pytest.skip(f"shared fixture {path} is absent (set ARLOPTI_SHARED to the folder holding fixtures/)")
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from arlopti.models.loading import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    from arlopti.models.loading import build_tiny_model

    return build_tiny_model(tiny_tokenizer)


@pytest.fixture()
def tiny_llama(tiny_tokenizer):
    from arlopti.models.loading import TinySpec, build_tiny_model

    return build_tiny_model(tiny_tokenizer, TinySpec(arch="llama", tie_word_embeddings=False))


@pytest.fixture(scope="session")
def smollm2_path():
    from arlopti.models.loading import smollm2_local_path

    try:
        return smollm2_local_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))
