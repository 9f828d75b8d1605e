"""The roles of a job, by name: the one list every role loop, CLI choice and builder reads (`omnirl.api.spec`
re-exports it). Plain constants, so `omnirl --help` builds its parser without loading the spec's models."""

ROLE_NAMES: tuple[str, ...] = ("rollout", "reward", "actor", "controller")
"""The four roles of a job, in the launcher's order."""
MODEL_ROLES: tuple[str, ...] = ("rollout", "actor")
"""The roles that hold the model (on their accelerator): attention kernel, /dev/shm for NCCL/HCCL."""
