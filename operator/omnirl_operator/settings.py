"""Operator settings: a documented dataclass read once from the operator's environment.

The Helm chart sets these variables on the operator Deployment (values.yaml documents each one).
Builders receive an :class:`OperatorSettings` explicitly, so they stay pure and tests can pass
their own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_VERSION = "0.1.0"


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not a number; set it to seconds, e.g. {name}=30") from exc
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be > 0 seconds")
    return value


@dataclass(frozen=True)
class OperatorSettings:
    """What the operator needs besides the RLJob itself.

    Attributes:
        rollout_image: image of rollout pods (``OMNIRL_ROLLOUT_IMAGE``).
        reward_image: image of reward pods (``OMNIRL_REWARD_IMAGE``).
        trainer_image: image of the actor and the controller (``OMNIRL_TRAINER_IMAGE``).
        image_pull_policy: ``IfNotPresent`` | ``Always`` | ``Never`` (``OMNIRL_IMAGE_PULL_POLICY``).
        image_pull_secrets: names of the ``imagePullSecrets`` of every RLJob pod, judges included
            (``OMNIRL_IMAGE_PULL_SECRETS``, comma-separated; each must exist in the job's namespace).
        default_redis_url: TransferQueue URL for jobs whose ``spec.transferQueue.redisUrl`` is empty
            (``OMNIRL_DEFAULT_REDIS_URL``; the chart points it at its bundled Redis). ``None``
            makes such jobs invalid (the operator cannot guess a Redis).
        default_redis_password_secret: Secret (key ``password``) in the job's namespace that role
            pods read ``REDIS_PASSWORD`` from when the spec names none
            (``OMNIRL_DEFAULT_REDIS_PASSWORD_SECRET``).
        default_redis_password: the operator's own password for the default Redis, used by the
            finalizer (``OMNIRL_DEFAULT_REDIS_PASSWORD``, from the chart's Secret).
        cpu_request: CPU request of every role container (``OMNIRL_CPU_REQUEST``, e.g. ``"1"``).
        memory_request: memory request of every role container (``OMNIRL_MEMORY_REQUEST``).
        resync_seconds: period of the level-triggered timer (``OMNIRL_RESYNC_SECONDS``), seconds.
        run_owner_ttl_seconds: life of an RLJob's claim of its name on its Redis unless a reconcile renews
            it (``OMNIRL_RUN_OWNER_TTL_SECONDS``, seconds; ``omnirl.transfer.owner.OWNER_TTL_S``): how long a
            job whose operator is gone still holds its name; more than ``resync_seconds``.
        data_root: directory in the pods that relative ``spec.data`` / ``spec.model.path`` values
            resolve against (``OMNIRL_DATA_ROOT``); the images ship ``examples/`` there, so the
            example manifests run unchanged. Mount your own data and use absolute paths.
    """

    rollout_image: str = f"ghcr.io/omnirl/rollout:{DEFAULT_VERSION}"
    reward_image: str = f"ghcr.io/omnirl/reward:{DEFAULT_VERSION}"
    trainer_image: str = f"ghcr.io/omnirl/trainer:{DEFAULT_VERSION}"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    default_redis_url: str | None = None
    default_redis_password_secret: str | None = None
    default_redis_password: str | None = None
    cpu_request: str = "1"
    memory_request: str = "2Gi"
    resync_seconds: float = 15.0
    run_owner_ttl_seconds: float = 120.0
    data_root: str = "/opt/omnirl/examples"

    def __post_init__(self) -> None:
        if self.image_pull_policy not in ("IfNotPresent", "Always", "Never"):
            raise ValueError(
                f"OMNIRL_IMAGE_PULL_POLICY={self.image_pull_policy!r}: use IfNotPresent, Always or Never"
            )
        if not self.data_root.startswith("/"):
            raise ValueError(f"OMNIRL_DATA_ROOT={self.data_root!r} must be an absolute path in the pods")
        if self.run_owner_ttl_seconds <= self.resync_seconds:  # every resync must renew it before it lapses
            raise ValueError(f"OMNIRL_RUN_OWNER_TTL_SECONDS={self.run_owner_ttl_seconds:g} must be more than "
                             f"OMNIRL_RESYNC_SECONDS={self.resync_seconds:g}: a running RLJob's claim of its name "
                             "would lapse between two reconciles; raise it (default 120)")
        for name in ("rollout_image", "reward_image", "trainer_image"):
            if not getattr(self, name):
                raise ValueError(f"{name} is empty; set OMNIRL_{name.upper()} to an image reference")

    def image_for(self, role: str) -> str:
        """The image of ``role`` (rollout | reward | actor | controller).

        Raises:
            ValueError: for an unknown role.
        """
        images = {
            "rollout": self.rollout_image,
            "reward": self.reward_image,
            "actor": self.trainer_image,
            "controller": self.trainer_image,
        }
        if role not in images:
            raise ValueError(f"unknown role {role!r}; expected one of {sorted(images)}")
        return images[role]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        """Read the settings from ``env`` (default: ``os.environ``); unset variables keep defaults.

        Raises:
            ValueError: for an invalid number or pull policy, naming the variable.
        """
        env = os.environ if env is None else env
        d = cls()
        return cls(
            rollout_image=env.get("OMNIRL_ROLLOUT_IMAGE") or d.rollout_image,
            reward_image=env.get("OMNIRL_REWARD_IMAGE") or d.reward_image,
            trainer_image=env.get("OMNIRL_TRAINER_IMAGE") or d.trainer_image,
            image_pull_policy=env.get("OMNIRL_IMAGE_PULL_POLICY") or d.image_pull_policy,
            image_pull_secrets=tuple(n.strip() for n in (env.get("OMNIRL_IMAGE_PULL_SECRETS") or "").split(",")
                                     if n.strip()),
            default_redis_url=env.get("OMNIRL_DEFAULT_REDIS_URL") or None,
            default_redis_password_secret=env.get("OMNIRL_DEFAULT_REDIS_PASSWORD_SECRET") or None,
            default_redis_password=env.get("OMNIRL_DEFAULT_REDIS_PASSWORD") or None,
            cpu_request=env.get("OMNIRL_CPU_REQUEST") or d.cpu_request,
            memory_request=env.get("OMNIRL_MEMORY_REQUEST") or d.memory_request,
            resync_seconds=_positive_float(env, "OMNIRL_RESYNC_SECONDS", d.resync_seconds),
            run_owner_ttl_seconds=_positive_float(env, "OMNIRL_RUN_OWNER_TTL_SECONDS", d.run_owner_ttl_seconds),
            data_root=env.get("OMNIRL_DATA_ROOT") or d.data_root,
        )
