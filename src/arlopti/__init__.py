"""arlopti: GRPO + Advantage Reweighting + Low-Probability Token Isolation (arXiv 2505.12929)."""

__version__ = "0.1.0"

# Importing the package makes its configs composable: the ${run_label:...} resolver and the group
# schemas (algorithm/schema, ...) in Hydra's ConfigStore are registered on import.
from arlopti import config as _config  # noqa: E402,F401
from arlopti import run_name as _run_name  # noqa: E402,F401
from arlopti import config_resolvers as _config_resolvers  # noqa: E402,F401
# arlopti.run(...): a run from Python (arlopti/api.py; its module imports only the standard library).
from arlopti.api import RunResult, run  # noqa: E402,F401
