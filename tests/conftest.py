"""Shared fixtures: a tokenizer trained in-process, tiny random models, the shared data dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ARLOPTI_SHARED", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures"

torch.set_num_threads(min(2, os.cpu_count() or 1))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
