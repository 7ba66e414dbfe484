"""arlopti: GRPO + Advantage Reweighting + Low-Probability Token Isolation (arXiv 2505.12929).

Importing any part of the package makes its configs composable: :mod:`arlopti.config` registers the
group schemas (``algorithm/schema``, ...) in Hydra's ConfigStore and the resolvers the configs use.

Read first: :mod:`arlopti.entry.train` (what a run builds), docs/architecture.md (how the folders stack).
"""

__version__ = "0.1.0"

# arlopti.run(...): a run from Python (arlopti/entry/api.py; its module imports only the standard library).
from arlopti.entry.api import RunResult, run  # noqa: E402,F401
