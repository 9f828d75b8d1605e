"""Judge servers a job runs itself (`reward[].server`): the pure parts both launchers share.

On Kubernetes the operator runs each judge as Deployment + Service `<job>-judge-<reward>`; under
`omnirl run` the launcher starts it as a local process on a free port. Either way the roles read
a *wired* manifest (:func:`wire`): each such reward gets the server's URL in `url` and no
`server`, so the reward workers need not know who runs the judge.
"""

from __future__ import annotations

from omnirl.api.spec import RewardServerSpec, RewardSpec, RLJob

VOLUME_MOUNT = "/models"  # where `server.volume` is mounted; `{modelPath}` then means this


def judge_rewards(job: RLJob) -> list[RewardSpec]:
    """The rewards whose server the job runs, in manifest order."""
    return [r for r in job.spec.reward if r.server is not None]


def dns_name(reward: RewardSpec) -> str:
    """The reward's name as a Kubernetes name part (`_` is not allowed there: `-`)."""
    return reward.name.replace("_", "-")


def model_path(server: RewardServerSpec) -> str | None:
    """The model directory the server process sees (`/models` for a volume), or None."""
    return VOLUME_MOUNT if server.volume is not None else server.modelPath


def argv(server: RewardServerSpec, port: int | str) -> list[str]:
    """`command + args` with `{port}` and `{modelPath}` substituted (plain text replacement, so
    other braces, e.g. JSON in an argument, pass through)."""
    model = model_path(server) or ""
    return [a.replace("{port}", str(port)).replace("{modelPath}", model) for a in [*server.command, *server.args]]


def url(reward: RewardSpec, host: str, port: int) -> str:
    """The endpoint the reward workers use: `host:port` for gRPC, else `http://host:port<urlPath>`."""
    if reward.kind == "grpc":
        return f"{host}:{port}"
    return f"http://{host}:{port}{reward.server.urlPath}"


def wire(job: RLJob, urls: dict[str, str]) -> RLJob:
    """A copy of `job` whose judge rewards carry `urls[name]` and no `server`.

    Raises:
        KeyError: a judge reward has no URL in `urls`.
    """
    rewards = [r.model_copy(update={"url": urls[r.name], "server": None}) if r.server is not None else r
               for r in job.spec.reward]
    return job.model_copy(update={"spec": job.spec.model_copy(update={"reward": rewards})})


def check_written(written: RLJob, wired: RLJob) -> None:
    """Check that `wired` is `written` with its judges wired in (`wire` with the URLs `wired` holds):
    `written` is then the manifest as the user wrote it of the very job the roles run.

    Raises:
        ValueError: another job or other settings (naming the first field that differs), or a judge
            reward of `written` that `wired` does not have.
    """
    urls = {r.name: r.url for r in wired.spec.reward}
    missing = [r.name for r in judge_rewards(written) if urls.get(r.name) is None]
    if missing:
        raise ValueError(f"its judge reward {missing[0]!r} has no url in the job's manifest")
    got, want = wire(written, urls).model_dump(), wired.model_dump()
    for part in ("apiVersion", "kind", "metadata", "spec"):
        a, b = got.get(part), want.get(part)
        if a != b:
            keys = [k for k in sorted({*a, *b}) if a.get(k) != b.get(k)] if isinstance(a, dict) and isinstance(b, dict) else []
            raise ValueError(f"it is not the manifest of the job's --job file: {part}{'.' + keys[0] if keys else ''} "
                             "differs")
