"""Strict configs: the schema, loading with ``extends:`` and overrides, the site profile, run files."""

from .load import dumps_yaml, load_config, read_file, to_builtins, validate_config
from .merge import deep_merge
from .redact import redact
from .rundir import make_private_dir, open_private, run_dir, write_run_files
from .schema import (
    AdamParams,
    AgentsConfig,
    CheckpointConfig,
    Config,
    EnvironmentConfig,
    EvalConfig,
    GatewayConfig,
    InferenceParams,
    NatsConfig,
    NatsTLS,
    PluginConfig,
    RolloutConfig,
    SplitsConfig,
    StatsConfig,
    TrainConfig,
    WandbConfig,
    WorkflowConfig,
    entry_names,
    workflow_for,
)
from .site import Site, load_site, site_path
from .validate import AssemblyError, ConfigError

__all__ = [
    "AdamParams",
    "AgentsConfig",
    "AssemblyError",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "EnvironmentConfig",
    "EvalConfig",
    "GatewayConfig",
    "InferenceParams",
    "NatsConfig",
    "NatsTLS",
    "PluginConfig",
    "RolloutConfig",
    "Site",
    "SplitsConfig",
    "StatsConfig",
    "TrainConfig",
    "WandbConfig",
    "WorkflowConfig",
    "deep_merge",
    "dumps_yaml",
    "entry_names",
    "load_config",
    "load_site",
    "make_private_dir",
    "open_private",
    "read_file",
    "redact",
    "run_dir",
    "site_path",
    "to_builtins",
    "validate_config",
    "workflow_for",
    "write_run_files",
]
