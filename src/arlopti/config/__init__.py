"""Typed configuration of a run: the one place where every setting, its default, type and help live.

Three rooms, each importable on its own:

* :mod:`arlopti.config.schema`: the dataclasses, one per Hydra group, each field declared with
  ``setting(default, help, choices=..., range=...)``, and their registration in Hydra's
  ConfigStore (done on import of this package: ``train.py`` / ``eval.py`` import it before composing);
* :mod:`arlopti.config.check`: the generic checker (types from the annotations, choices, ranges,
  building a dataclass from a mapping, command-line overrides), which knows no particular key;
* :mod:`arlopti.config.rules`: the cross-field rules, each stated once (``validate_run``,
  ``validate_once`` and the rules other code calls too, such as ``check_mis_bounds``).

This package re-exports the names the rest of the tree imports (``from arlopti.config import X``).
The learning-rate schedules live with their only user, :mod:`arlopti.learner.optim`.

Read first: :mod:`arlopti.config.schema` (every setting with its default and help).
"""

from arlopti.config.check import (field_default, unwrap_optional, check_fields, check_overrides, check_value,
                                  expected_type, field_choices, field_types, from_dict, saved_run_as_current,
                                  walk_fields)
from arlopti.config.rules import (check_mis_bounds, check_rollout_correction_logprobs, check_rollout_offload,
                                  validate_once, validate_run)
from arlopti.config.resolvers import register_resolvers
from arlopti.config.schema import (RETIRED_KEYS, AlgorithmConfig, AsyncConfig, ConfigError, DapoConfig, LoptiConfig,
                                   LoraConfig, ModelConfig, OptimConfig, RolloutConfig, RolloutCorrectionConfig,
                                   RunConfig, ServerConfig, SizesConfig, TinyModelConfig, TokenMethodConfig,
                                   config_key, register_configs, schemas, setting)

__all__ = [
    "AlgorithmConfig", "AsyncConfig", "ConfigError", "DapoConfig", "LoptiConfig", "LoraConfig",
    "ModelConfig", "OptimConfig", "RETIRED_KEYS", "RolloutConfig", "RolloutCorrectionConfig", "RunConfig",
    "ServerConfig", "SizesConfig", "TinyModelConfig", "TokenMethodConfig", "check_fields",
    "check_mis_bounds", "check_overrides", "check_rollout_correction_logprobs", "check_rollout_offload",
    "check_value", "config_key", "expected_type", "field_choices", "field_default", "field_types",
    "from_dict", "register_configs", "register_resolvers", "saved_run_as_current", "schemas", "setting",
    "unwrap_optional", "validate_once", "validate_run", "walk_fields",
]

register_configs()
register_resolvers()
