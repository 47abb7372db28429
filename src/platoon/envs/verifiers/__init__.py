"""verifiers environments (Prime Intellect's `verifiers`) as env services: `service: verifiers://ENV_ID`.

`backend` is the env backend and its sessions, `process` platoon's side of the worker process,
`worker` the worker itself (run under the venv's Python >= 3.12, never imported here), `venv` the
venv it runs in.
"""

from .backend import SPLITS, VerifiersBackend, VerifiersSession

__all__ = ["SPLITS", "VerifiersBackend", "VerifiersSession"]
