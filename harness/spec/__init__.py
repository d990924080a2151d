"""The spec layer: YAML (Hydra) -> typed spec -> validated spec -> identity (docs/design.md, "The spec").

    schema.py    the dataclasses: the only home of every default (RunConfig() is the default spec)
    compose.py   Hydra: the schema's defaults, experiments/config.yaml and its groups, the overrides
    validate.py  every check, one function per section (a ConfigError names the key; the CLIs exit 2)
    identity.py  which keys say what a run computes: the one table of signature rules

``load(overrides)`` is what the entry points call. This package imports no backend: a backend contributes its
section and its identity markers through the backend registry (``harness.backends``; ``tests/test_layers.py``).
"""
from harness.errors import ConfigError
from harness.spec.compose import EXPERIMENTS, GROUPS, compose, config_dirs, group_options, load
from harness.spec.schema import (DTYPES, PERTURBATIONS, BackendConfig, DiagnosticsConfig, EstimatorConfig,
                                 InferenceConfig, ModelConfig, RunConfig, TaskConfig, TrackingConfig, TrainerConfig,
                                 WarmStartConfig, defaults, from_dict, group_signature, perturbations_on, signature)
from harness.spec.validate import LIMITS, NAME_MAX, SEED_MAX, build, safe_name, validate

__all__ = ["ConfigError", "EXPERIMENTS", "GROUPS", "compose", "config_dirs", "group_options", "load", "DTYPES",
           "PERTURBATIONS", "BackendConfig", "DiagnosticsConfig", "EstimatorConfig", "InferenceConfig", "ModelConfig",
           "RunConfig", "TaskConfig", "TrackingConfig", "TrainerConfig", "WarmStartConfig", "defaults", "from_dict",
           "group_signature", "perturbations_on", "signature", "LIMITS", "NAME_MAX", "SEED_MAX", "build",
           "safe_name", "validate"]
