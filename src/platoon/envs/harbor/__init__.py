"""Harbor tasks and datasets: parsing, refusals, held-out splits and grading.

Pure functions over task directories plus `grade`, which runs a task's tests in a
platoon sandbox; nothing here touches the bus.
"""

from .config import (
    AgentConfig,
    Author,
    EnvironmentConfig,
    Healthcheck,
    PackageInfo,
    SolutionConfig,
    TaskConfig,
    VerifierConfig,
)
from .dataset import Dataset, Holdout, dataset_digest, holdout_groups, load_dataset
from .errors import HarborError, TaskDefect
from .grading import Grade, grade, parse_rewards, read_rewards
from .spec import sandbox_spec_for
from .task import HarborTask, load_task, resolve_env

__all__ = [
    "AgentConfig",
    "Author",
    "Dataset",
    "EnvironmentConfig",
    "Grade",
    "HarborError",
    "HarborTask",
    "Healthcheck",
    "Holdout",
    "PackageInfo",
    "SolutionConfig",
    "TaskConfig",
    "TaskDefect",
    "VerifierConfig",
    "dataset_digest",
    "grade",
    "holdout_groups",
    "load_dataset",
    "load_task",
    "parse_rewards",
    "read_rewards",
    "resolve_env",
    "sandbox_spec_for",
]
