"""Cross-field checks of the RLJob spec: each names the exact field (`FieldProblem.path`)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from omnirl.api.errors import FieldProblem, ManifestError, format_value
from omnirl.api.loader import dump_rljob, job_from_dict
from omnirl.api.problems import dotted, problem_lines, walk
from omnirl.api.spec import AlgorithmSpec, NFTSpec, RLJob, RLJobSpec, RolesSpec, RSSpec

MINIMAL: dict[str, Any] = {
    "apiVersion": "omnirl.dev/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "j"},
    "spec": {"data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]},
}


def _lines(spec_update: dict[str, Any]) -> list[str]:
    doc = {**MINIMAL, "spec": {**MINIMAL["spec"], **spec_update}}
    with pytest.raises(ValidationError) as info:
        RLJob.model_validate(doc)
    return [text for _, text in problem_lines(RLJob, info.value)]


def test_defaults_are_valid_and_match_the_recipes() -> None:
    job = RLJob.model_validate(MINIMAL)
    a = job.spec.algorithm
    assert (a.name, a.groupSize, a.sampling.numSteps, a.flowGrpo.window.range) == ("flow-grpo", 8, 10, (0, 5))
    assert (a.flowGrpo.noiseLevel, a.flowGrpo.clipRange, a.flowGrpo.klCoef) == (0.7, 1e-4, 0.04)
    assert (a.nft.advantageMax, a.nft.sigmaRange) == (5.0, (0.02, 0.98))
    assert job.spec.roles.rollout.accelerator.type == "cpu"  # a plain string, not an Enum
    assert job.spec.failurePolicy.actor == "restart-job"


@pytest.mark.parametrize(
    "update,expected",
    [
        (
            {"algorithm": {"sampling": {"numSteps": 4}}},
            "spec.algorithm.flowGrpo.window.range: [0, 5] is invalid: hi must be <= sampling.numSteps - 1 = 3 "
            "(the last denoising step is never trained)",
        ),
        (
            {"algorithm": {"flowGrpo": {"window": {"size": 6}}}},
            "spec.algorithm.flowGrpo.window.size: 6 is invalid: must be <= hi - lo = 5 (window.range [0, 5])",
        ),
        (
            {"algorithm": {"flowGrpo": {"window": {"range": [3, 3]}}}},
            "spec.algorithm.flowGrpo.window.range: [3, 3] is invalid: must satisfy lo < hi",
        ),
        (
            {"algorithm": {"promptsPerStep": 3, "optimizer": {"updatesPerStep": 5}}},
            "spec.algorithm.optimizer.updatesPerStep: 5 is invalid: must divide the batch of promptsPerStep × "
            "groupSize = 24 samples",
        ),
        (
            {"algorithm": {"nft": {"sigmaRange": [0.5, 0.2]}}},
            "spec.algorithm.nft.sigmaRange: [0.5, 0.2] is invalid: must satisfy 0 < lo < hi < 1",
        ),
        (
            {"algorithm": {"flowGrpo": {"rolloutCorrection": {"rejectionSampling": {"band": [1.5, 2.0]}}}}},
            "spec.algorithm.flowGrpo.rolloutCorrection.rejectionSampling.band: [1.5, 2.0] is invalid: "
            "must satisfy 0 < lo < 1 < hi (w = 1 is on-policy)",
        ),
        (
            {"roles": {"rollout": {"accelerator": {"type": "nvidia"}}}},
            "spec.roles.rollout.accelerator.count: 0 is invalid: must be >= 1 for type nvidia",
        ),
        (
            {"roles": {"reward": {"accelerator": {"type": "cpu", "count": 2}}}},
            "spec.roles.reward.accelerator.count: 2 is invalid: must be 0 for type cpu (set type nvidia or ascend)",
        ),
        (
            {"roles": {"actor": {"accelerator": {"type": "ascend", "count": 4}}}},
            "spec.roles.actor.accelerator.count: 4 is invalid: must divide the actor's ranks, replicas × "
            "parallel.ulysses = 1 × 1 = 1 (each pod holds as many ranks as devices); valid: [1]",
        ),
        (
            {"roles": {"rollout": {"accelerator": {"type": "nvidia", "count": 2}}}},
            "spec.roles.rollout.accelerator.count: 2 is invalid: must be 1: a rollout replica is parallel.ulysses × "
            "parallel.tensor = 1 × 1 = 1 device(s) (a rank per device) in parallel.podsPerReplica = 1 pod(s); set "
            "count: 1, or raise parallel.ulysses/tensor to use more devices per replica",
        ),
        (
            {"reward": [{"name": "a", "kind": "ocr"}, {"name": "a", "kind": "jpeg"}]},
            'spec.reward[1].name: "a" is invalid: must be unique; reward[0] has it',
        ),
        (
            {"reward": [{"name": "judge", "kind": "vlm"}]},
            "spec.reward[0].url: null is invalid: required for kind vlm (the scorer's endpoint)",
        ),
        (
            {"model": {"family": "flux"}},
            'spec.model.path: "builtin" is invalid: must name a model directory for family flux (builtin, the default, is av-digits, ocr-digits only)',
        ),
        ({"reward": []}, "spec.reward: [] is invalid: must have at least 1 item(s)"),
        # names the API server refuses in the pods' secretKeyRef / the claim: validate said ok
        (
            {"transferQueue": {"passwordSecret": "Redis_Auth"}},
            'spec.transferQueue.passwordSecret: "Redis_Auth" is invalid: must name a Secret: at most 253 characters, '
            "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. redis-auth)",
        ),
        (
            {"storage": {"claimName": "Team_Runs"}},  # in words, not the CRD's regular expression
            'spec.storage.claimName: "Team_Runs" is invalid: must name a PersistentVolumeClaim: at most 253 '
            "characters, lowercase letters, digits, '-' and '.', starting and ending with a letter or digit "
            "(e.g. team-runs)",
        ),
        (
            {"storage": {"size": "1Gi", "storageClassName": "Fast_SSD"}},
            'spec.storage.storageClassName: "Fast_SSD" is invalid: must name a StorageClass: at most 253 characters, '
            "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. fast-ssd)",
        ),
        (
            {"storage": {"size": "1Gi", "storageClassName": "__"}},  # nothing to keep: a made-up example
            'spec.storage.storageClassName: "__" is invalid: must name a StorageClass: at most 253 characters, '
            "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. team-runs)",
        ),
    ],
)
def test_cross_field_checks_name_the_field(update: dict[str, Any], expected: str) -> None:
    assert _lines(update) == [expected]


def test_nft_jobs_ignore_the_flowgrpo_window() -> None:
    a = AlgorithmSpec.model_validate({"name": "diffusion-nft", "sampling": {"numSteps": 4}})
    assert a.flowGrpo.window.range == (0, 5) and a.sampling.numSteps == 4


@pytest.mark.parametrize("name,block,written,owner", [
    ("flow-grpo", "nft", {"beta": 0.1}, "diffusion-nft"),
    ("flow-grpo", "awm", {}, "awm"),  # an empty block is still written: refused
    ("diffusion-nft", "flowGrpo", {"klCoef": 0.04}, "flow-grpo"),  # equal to the default: refused too
    ("awm", "dgpo", {"anchor": {"decayMax": 0.5}}, "dgpo"),
])
def test_another_algorithms_block_is_refused(name: str, block: str, written: dict, owner: str) -> None:
    assert _lines({"algorithm": {"name": name, block: written}}) == [
        f"spec.algorithm.{block}: {format_value(written)} is invalid: algorithm.{block} is set but algorithm.name "
        f"is {name}, which ignores it: remove algorithm.{block}, or set algorithm.name: {owner}"]
    assert RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "algorithm": {"name": owner, block: written}}})


def test_field_problem_message_and_direct_construction() -> None:
    p = FieldProblem("window.range", [4, 12], "must be small")
    assert str(p) == "window.range: [4, 12] is invalid: must be small"
    with pytest.raises(ValidationError, match="controller.replicas: 3 is invalid"):
        RolesSpec.model_validate({"controller": {"replicas": 3}})
    with pytest.raises(ValidationError, match=r"band.0\n  Input should be greater than 0"):
        RSSpec(band=(0.0, 2.0))  # lo must be > 0
    with pytest.raises(ValidationError, match=r"sigmaRange.0\n  Input should be greater than 0"):
        NFTSpec(sigmaRange=(0.0, 0.5))
    with pytest.raises(ValueError, match="at least one problem"):
        ManifestError([])


def test_walk_and_dotted_paths() -> None:
    path, ann, parent = walk(RLJob, ("spec", "reward", 0, "params", "alphabet", "str"))
    assert dotted(path) == "spec.reward[0].params.alphabet"
    assert parent == dict[str, str | int | float | bool] and ann == str | int | float | bool
    assert walk(RLJob, ("spec", "nosuch", "x"))[1] is None
    assert RLJobSpec.model_fields["reward"].is_required()


@pytest.mark.parametrize(("model", "sampling", "field"), [
    ({"resolution": [512, 512]}, {}, "model.resolution"),
    ({"resolutions": [[512, 512]]}, {}, "model.resolutions"),
    ({}, {"guidanceScale": 4.5}, "algorithm.sampling.guidanceScale"),
])
def test_digits_rejects_diffusers_only_options(model: dict, sampling: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field}: .* is invalid: must be"):
        RLJobSpec.model_validate({"model": model, "algorithm": {"sampling": sampling},
                                  "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]})


def test_diffusers_resolution_must_fit_the_latent_grid() -> None:
    with pytest.raises(ValidationError, match=r"model.resolution: \[500, 512\] is invalid: .*\[496, 512\]"):
        RLJobSpec.model_validate({"model": {"family": "sd3", "path": "/m", "resolution": [500, 512]},
                                  "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]})


def _sd3_spec(**model) -> RLJobSpec:
    return RLJobSpec.model_validate({"model": {"family": "sd3", "path": "/m", **model},
                                     "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]})


def test_resolutions_are_dealt_in_turn_and_checked_one_by_one() -> None:
    model = _sd3_spec(resolutions=[[512, 512], [384, 640], [640, 384]]).model
    assert [model.resolution_for(i) for i in range(5)] == [(512, 512), (384, 640), (640, 384), (512, 512), (384, 640)]
    assert _sd3_spec(resolution=[256, 512]).model.resolution_for(7) == (256, 512)
    assert _sd3_spec().model.resolution_for(0) is None  # the adapter's default
    with pytest.raises(ValidationError, match=r"model.resolutions\[1\]: \[384, 500\] is invalid: .*\[384, 496\]"):
        _sd3_spec(resolutions=[[512, 512], [384, 500]])
    with pytest.raises(ValidationError, match=r"model.resolutions: .* cannot be set together with model.resolution"):
        _sd3_spec(resolution=[512, 512], resolutions=[[512, 512], [384, 640]])
    with pytest.raises(ValidationError, match=r"model.resolutions"):
        _sd3_spec(resolutions=[])
    with pytest.raises(ValidationError, match=r"must be a list of \[height, width\] pairs, e.g. \[\[512, 512\]"):
        _sd3_spec(resolutions=[512, 512])


def test_resolutions_load_through_the_strict_loader() -> None:
    # the loader (omnirl validate / run) validates strictly as JSON: the pairs must pass there too
    doc = {"apiVersion": RLJob.model_fields["apiVersion"].default, "kind": "RLJob", "metadata": {"name": "ms"},
           "spec": {"model": {"family": "sd3", "path": "/m", "resolutions": [[32, 32], [32, 48]]},
                    "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]}}
    assert job_from_dict(doc).spec.model.resolutions == [(32, 32), (32, 48)]


@pytest.mark.parametrize("family", ["ocr-digits", "flux", "qwen-image"])
def test_packed_batching_needs_a_family_that_packs(family: str) -> None:
    model = {"family": family} if family == "ocr-digits" else {"family": family, "path": "/m"}
    with pytest.raises(ValidationError, match=rf'roles.rollout.batching: "packed" is invalid: .*sd3\); '
                       rf"model.family is {family}: use batching stepwise"):
        RLJobSpec.model_validate({"model": model, "roles": {"rollout": {"batching": "packed"}},
                                  "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]})
    packed = RLJobSpec.model_validate({"model": {"family": "sd3", "path": "/m"},
                                       "roles": {"rollout": {"batching": "packed"}},
                                       "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "j", "kind": "jpeg"}]})
    assert packed.roles.rollout.batching == "packed"


def test_cudnn_attention_needs_nvidia_roles_and_half_precision() -> None:
    gpu = {"accelerator": {"type": "nvidia", "count": 1}}
    half = {"family": "sd3", "path": "/m", "dtype": "bfloat16", "attention": "cudnn"}
    reward = [{"name": "j", "kind": "jpeg"}]
    assert _lines({"model": half, "roles": {"rollout": gpu}, "reward": reward}) == [
        'spec.model.attention: "cudnn" is invalid: runs on NVIDIA GPUs only; roles.actor.accelerator.type is cpu: '
        "set auto (cuDNN where it applies) or torch"]
    assert _lines({"model": {**half, "dtype": "float32"}, "roles": {"rollout": gpu, "actor": gpu}, "reward": reward}) == [
        'spec.model.attention: "cudnn" is invalid: needs model.dtype bfloat16 (it is float32): set the '
        "dtype, or attention auto or torch"]
    job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "model": half, "reward": reward,
                                                    "roles": {"rollout": gpu, "actor": gpu}}})
    assert job.spec.model.attention == "cudnn"
    assert _lines({"model": {**half, "family": "flux"}, "roles": {"rollout": gpu, "actor": gpu}, "reward": reward}) == [
        'spec.model.attention: "cudnn" is invalid: is checked for families qwen-image, sd3 only (model.family is '
        "flux; FLUX's gradients through cuDNN were wrong on the H200): set auto or torch"]
    # the built-in model: the family is the reason, FLUX's story is not (nor its CPU roles, checked after)
    assert _lines({"model": {"attention": "cudnn"}}) == [
        'spec.model.attention: "cudnn" is invalid: is checked for families qwen-image, sd3 only (model.family is '
        "ocr-digits): set auto or torch"]
    assert RLJob.model_validate(MINIMAL).spec.model.attention == "auto"  # CPU roles, float32: auto is torch's choice


def test_config_errors_name_the_field_once_and_keep_other_errors() -> None:
    from omnirl.api.errors import ConfigError, config_errors

    with pytest.raises(ConfigError) as info:
        with config_errors("spec.model.path"):
            open("/nonexistent/model.safetensors")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    # as raised: the path keeps its closing quote (a blanket strip of quotes cut it off)
    assert str(info.value) == "spec.model.path: [Errno 2] No such file or directory: '/nonexistent/model.safetensors'"
    with pytest.raises(ConfigError, match=r"^spec.data.trainPrompts: p.txt not found$"):
        with config_errors("spec.data"):  # the error names its field already: not named twice
            raise FileNotFoundError("spec.data.trainPrompts: p.txt not found")
    with pytest.raises(ConfigError, match=r"^checkpoint c: policy; restore it$"), \
            config_errors("checkpoint c", KeyError, fix="restore it"):
        raise KeyError("policy")
    with pytest.raises(RuntimeError), config_errors("spec.model.path"):  # not a reading error: a crash
        raise RuntimeError("CUDA out of memory")


_JUDGE = {"name": "judge", "kind": "http", "server": {"command": ["serve"], "urlPath": "/v1/score"}}


@pytest.mark.parametrize("update,expected", [
    # a misspelt container name: the merge would add an image-less sidecar, which the API server refuses
    ({"roles": {"rollout": {"template": {"spec": {"containers": [{"name": "rolout", "resources": {}}]}}}}},
     'spec.roles.rollout.template.spec.containers[0].name: "rolout" is invalid: is not the generated container '
     "(rollout) and has no image, so the pod would be refused; name it rollout to merge into that container, or "
     "give the sidecar an image"),
    ({"reward": [{"name": "ocr", "kind": "ocr"},
                 {**_JUDGE, "server": {**_JUDGE["server"], "template": {"spec": {"containers": [{"name": "vllm"}]}}}}]},
     'spec.reward[1].server.template.spec.containers[0].name: "vllm" is invalid: is not the generated container '
     "(judge) and has no image, so the pod would be refused; name it judge to merge into that container, or give "
     "the sidecar an image"),
    # a forgotten `spec:` level: Kubernetes would drop the node selector without a word
    ({"roles": {"actor": {"template": {"nodeSelector": {"pool": "h100"}}}}},
     'spec.roles.actor.template.nodeSelector: {"pool": "h100"} is invalid: a pod template holds only metadata and '
     "spec (Kubernetes ignores anything else); move it under spec: template: {spec: {nodeSelector: ...}}"),
    # a container without a name would replace the generated one instead of merging into it
    ({"roles": {"reward": {"template": {"spec": {"containers": [{"resources": {}}]}}}}},
     'spec.roles.reward.template.spec.containers[0]: {"resources": {}} is invalid: must be a mapping with a name: '
     "reward to change the generated container, another name (and an image) for a sidecar"),
    ({"roles": {"reward": {"template": {"spec": {"containers": {"name": "reward"}}}}}},
     'spec.roles.reward.template.spec.containers: {"name": "reward"} is invalid: must be a list, e.g. '
     "[{name: reward, resources: {...}}]"),
    # the role served health on 9000 while the operator's probes asked 8081: the kubelet restarted it until the job failed
    ({"roles": {"reward": {"template": {"spec": {"containers": [{"name": "reward", "env": [
        {"name": "OMNIRL_THREADS", "value": "4"}, {"name": "OMNIRL_HEALTH_PORT", "value": "9000"}]}]}}}}},
     'spec.roles.reward.template.spec.containers[0].env[1]: {"name": "OMNIRL_HEALTH_PORT", "value": "9000"} is '
     "invalid: OMNIRL_HEALTH_PORT is set by the operator to 8081, the port of the role's gRPC health, which the pod's "
     "startupProbe, livenessProbe and readinessProbe and its containerPort grpc-health point at: on another port "
     "every probe fails and the kubelet restarts the container until the job fails; remove this entry (a pod has its "
     "own network, so 8081 can clash only with a sidecar of the same pod: move the sidecar's port)"),
    ({"roles": {"controller": {"template": {"spec": {"containers": [
        {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
        {"name": "controller", "env": [{"name": "OMNIRL_METRICS_PORT", "valueFrom": {"configMapKeyRef": {
            "name": "ports", "key": "metrics"}}}]}]}}}}},
     'spec.roles.controller.template.spec.containers[1].env[0]: {"name": "OMNIRL_METRICS_PORT", "valueFrom": '
     '{"configMapKeyRef": {"name": "po... is invalid: OMNIRL_METRICS_PORT is set by the operator '
     "to 9090, the port of the controller's /metrics, which the pod's containerPort metrics and the job's headless "
     "Service <job>-metrics (the chart's ServiceMonitor) point at: on another port Prometheus scrapes nothing; remove "
     "this entry (a pod has its own network, so 9090 can clash only with a sidecar of the same pod: move the "
     "sidecar's port)"),
    ({"roles": {"actor": {"template": {"spec": {"containers": [{"name": "actor", "env": {"OMNIRL_THREADS": "4"}}]}}}}},
     'spec.roles.actor.template.spec.containers[0].env: {"OMNIRL_THREADS": "4"} is invalid: must be a list of '
     "{name, value} entries"),
])
def test_a_pod_template_that_would_not_run_as_meant_is_refused(update: dict[str, Any], expected: str) -> None:
    assert _lines(update) == [expected]


def test_a_grpc_judge_with_an_http_health_path_is_refused() -> None:
    # the kubelet's httpGet (and omnirl run's GET) never passes on a gRPC port: the job waited forever
    judge = {"name": "judge", "kind": "grpc", "server": {"command": ["serve"], "healthPath": "/healthz"}}
    assert _lines({"reward": [MINIMAL["spec"]["reward"][0], judge]}) == [
        'spec.reward[1].server.healthPath: "/healthz" is invalid: must be unset for kind grpc (a gRPC server does '
        "not answer an HTTP GET: the judge would never be ready); remove it, the judge is then ready once its port "
        "accepts connections"]


def test_a_grpc_judge_with_an_url_path_is_refused() -> None:
    # the wired target of a gRPC judge is host:port (omnirl.scorers.judges.judge_url): the path was dropped silently
    judge = {"name": "judge", "kind": "grpc", "server": {"command": ["serve"], "urlPath": "/v1/score"}}
    assert _lines({"reward": [MINIMAL["spec"]["reward"][0], judge]}) == [
        'spec.reward[1].server.urlPath: "/v1/score" is invalid: must be unset for kind grpc (the reward workers reach '
        "a gRPC server at host:port, so a path would be ignored); remove it, or use kind http for a server of the "
        "HTTP scorer protocol at that path"]
    judge["server"]["urlPath"] = "/"  # the default, written out: nothing is dropped
    job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "reward": [MINIMAL["spec"]["reward"][0], judge]}})
    from omnirl.scorers.judges import url

    assert url(job.spec.reward[1], "127.0.0.1", 50051) == "127.0.0.1:50051"


def test_a_pod_template_merging_into_the_container_or_adding_a_sidecar_is_accepted() -> None:
    roles = {"rollout": {"template": {"metadata": {"labels": {"team": "rl"}}, "spec": {
        "nodeSelector": {"pool": "h100"},
        "containers": [{"name": "rollout", "resources": {"requests": {"memory": "64Gi"}},
                        "env": [{"name": "OMNIRL_THREADS", "value": "8"}]},
                       # a sidecar's own variables are its own: the role process never reads them
                       {"name": "log-shipper", "image": "fluent/fluent-bit:3.0",
                        "env": [{"name": "OMNIRL_HEALTH_PORT", "value": "9000"}]}]}}}}
    judge = {**_JUDGE, "server": {**_JUDGE["server"], "template": {"spec": {"containers": [{"name": "judge"}]}}}}
    job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "roles": roles,
                                                    "reward": [MINIMAL["spec"]["reward"][0], judge]}})
    assert [c["name"] for c in job.spec.roles.rollout.template["spec"]["containers"]] == ["rollout", "log-shipper"]


def test_object_names_kubernetes_accepts_pass() -> None:
    spec = {**MINIMAL["spec"], "transferQueue": {"passwordSecret": "redis.auth-1"},
            "storage": {"size": "1Gi", "storageClassName": "gp3.encrypted"}}
    job = RLJob.model_validate({**MINIMAL, "spec": spec})
    assert (job.spec.transferQueue.passwordSecret, job.spec.storage.storageClassName) == ("redis.auth-1", "gp3.encrypted")
    spec["storage"]["storageClassName"] = ""  # no class: bind a pre-made PersistentVolume
    spec["transferQueue"]["passwordSecret"] = ""  # no Secret, as unset
    assert RLJob.model_validate({**MINIMAL, "spec": spec}).spec.storage.storageClassName == ""


_FORM = "use redis://[[user]:password@]host[:port][/db], or rediss:// for TLS, e.g. redis://redis:6379/0"


@pytest.mark.parametrize("url,why", [
    ("http://redis:6379", "must start with redis:// or rediss:// (redis-py's schemes); " + _FORM),
    ("redis:/redis", "has no host (redis-py would quietly use localhost); " + _FORM),
    ("redis://:6379/0", "has no host (redis-py would quietly use localhost); " + _FORM),
    ("redis://redis:0", "port must be 1..65535; " + _FORM),
    ("redis://redis:70000", "is not a valid URL (Port out of range 0-65535); " + _FORM),
    ("redis://redis:6379/queue", "the path must be a database number, not '/queue'; " + _FORM),
    ("redis://redis?db=2", "must have no query or fragment (connection options are not passed on); put the "
                           "database in the path: " + _FORM[4:]),
    ("unix:///run/redis.sock", "a unix socket is reachable only on one machine (a job's pods each have their own "
                               "filesystem); " + _FORM + ", or remove redisUrl for an embedded Redis"),
])
def test_a_redis_url_the_roles_cannot_use_is_refused(url: str, why: str) -> None:
    # each of these passed `omnirl validate` and failed only in `omnirl run` (or quietly meant localhost)
    assert _lines({"transferQueue": {"redisUrl": url}}) == [f"spec.transferQueue.redisUrl: \"{url}\" is invalid: {why}"]


def test_a_refused_redis_url_never_shows_its_password() -> None:
    assert _lines({"transferQueue": {"redisUrl": "http://app:s3cret@redis:6379/0"}}) == [
        'spec.transferQueue.redisUrl: "http://app:***@redis:6379/0" is invalid: must start with redis:// or '
        "rediss:// (redis-py's schemes); " + _FORM]


def test_every_redis_url_form_accepted_reaches_redis(redis_url: str) -> None:
    import redis

    from omnirl.launch.preflight import check_redis

    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    for url in (f"redis://127.0.0.1:{port}", f"redis://127.0.0.1:{port}/", f"redis://127.0.0.1:{port}/3",
                f"redis://default@127.0.0.1:{port}/0", ""):
        job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "transferQueue": {"redisUrl": url}}})
        if url:
            check_redis(job.spec.transferQueue.redisUrl)  # `omnirl run`'s pre-flight: a real PING
            with redis.Redis.from_url(url) as client:
                client.set("gaps:url-form", url)
                assert client.get("gaps:url-form") == url.encode()
    assert RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "transferQueue": {
        "redisUrl": "rediss://:pw@redis.example:6380/1"}}}).spec.transferQueue.redisUrl.startswith("rediss://")


def test_seeds_are_the_signed_64_bit_integers_derive_takes() -> None:
    # 2**64 passed `omnirl validate`; `omnirl run` then failed in the controller ("spec.data: seed argument ...")
    from omnirl.api.seeds import derive

    rule = "must be a signed 64-bit integer, -9223372036854775808 .. 9223372036854775807 (what derive hashes)"
    assert _lines({"seed": 2**64}) == [f"spec.seed: 18446744073709551616 is invalid: {rule}"]
    assert _lines({"validation": {"seed": -(2**63) - 1}}) == [f"spec.validation.seed: -9223372036854775809 is invalid: {rule}"]
    for seed in (2**63 - 1, -(2**63)):  # the bounds run: every draw's seed comes from derive
        job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "seed": seed, "validation": {"seed": seed}}})
        assert 0 <= derive(job.spec.seed, "sample") < 2**63 and 0 <= derive(job.spec.validation.seed, "validation") < 2**63


@pytest.mark.parametrize("path", ["/mnt/ckpt", "../ckpt", "runs/../../ckpt"])
def test_a_checkpoint_dir_outside_the_run_directory_is_refused(path: str) -> None:
    # the actor wrote there, the controller's export and a restarted pod looked in OUT/: not on the volume
    assert _lines({"checkpoint": {"dir": path}}) == [
        f'spec.checkpoint.dir: "{path}" is invalid: must be a path inside the run directory (relative, no \'..\'): '
        "on Kubernetes only the run directory is on the job's volume; e.g. checkpoints"]
    job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "checkpoint": {"dir": "ckpt/v1..2"}}})
    assert job.spec.checkpoint.dir == "ckpt/v1..2"  # '..' inside a name is a name


def test_a_stream_too_short_for_what_the_controller_holds_is_refused() -> None:
    # maxStreamLength 1 passed validate; `omnirl run` then stalled: the reward worker waited to publish a score
    # the controller keeps until its step is collected, the rollout on the reward, the controller on the rollout.
    # A refilled group's earlier scores stay too: promptsPerStep × groupSize passed and a refill stalled the job
    # (e2e/test_stream_refills.py), so the bound counts every attempt of every group.
    algo = {"promptsPerStep": 3, "groupSize": 4}
    assert _lines({"algorithm": algo, "transferQueue": {"maxStreamLength": 35}}) == [
        "spec.transferQueue.maxStreamLength: 35 is invalid: must be >= 36, what the controller holds in a stream at "
        "once (promptsPerStep × groupSize × 3 attempts = 3 × 4 × 3 scores of a step whose groups are all refilled); "
        "below it the roles wait on each other until the back-pressure timeout; raise it"]
    data = {"trainPrompts": "p.txt", "validationPrompts": "v.txt"}
    assert _lines({"algorithm": algo, "data": data, "validation": {"maxPrompts": 5},
                   "transferQueue": {"maxStreamLength": 40}}) == [
        "spec.transferQueue.maxStreamLength: 40 is invalid: must be >= 41, what the controller holds in a stream at "
        "once (promptsPerStep × groupSize × 3 attempts = 3 × 4 × 3 scores of a step whose groups are all refilled + "
        "validation.maxPrompts = 5 requests of a validation round); below it the roles wait on each other until "
        "the back-pressure timeout; raise it"]
    for spec in ({"algorithm": algo, "transferQueue": {"maxStreamLength": 36}},
                 {"algorithm": algo, "data": data, "validation": {"maxPrompts": 5}, "transferQueue": {"maxStreamLength": 41}}):
        RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], **spec}})


def test_a_scorer_timeout_the_clients_cannot_take_is_refused() -> None:
    # 1e10 passed validate; urllib then raised OverflowError (time_t) and gRPC answered DEADLINE_EXCEEDED at once
    judge = {"name": "judge", "kind": "http", "url": "http://judge:8000/v1/score", "timeoutSeconds": 1e10}
    assert _lines({"reward": [judge]}) == ["spec.reward[0].timeoutSeconds: 10000000000.0 is invalid: must be <= 86400"]
    import urllib.request

    with pytest.raises(OSError):  # a day is a timeout urllib takes: the refused port answers, no OverflowError
        urllib.request.urlopen("http://127.0.0.1:1/", timeout=RLJob.model_validate({**MINIMAL, "spec": {
            **MINIMAL["spec"], "reward": [{**judge, "timeoutSeconds": 86400}]}}).spec.reward[0].timeoutSeconds)


def test_failure_deadlines_the_startup_probe_and_store_cannot_take_are_refused() -> None:
    # startupDeadlineSeconds 1e12 passed validate; the operator rendered the startup probe's failureThreshold
    # 100000000060 (an int32 in Kubernetes) and a rollout worker's TCPStore timeout overflowed (int64 ns)
    assert _lines({"failurePolicy": {"startupDeadlineSeconds": 1e12, "progressDeadlineSeconds": 1e12}}) == [
        "spec.failurePolicy.progressDeadlineSeconds: 1000000000000.0 is invalid: must be <= 2592000",
        "spec.failurePolicy.startupDeadlineSeconds: 1000000000000.0 is invalid: must be <= 2592000"]
    from omnirl_operator.pods import role_container
    from omnirl_operator.settings import OperatorSettings

    longest = {"startupDeadlineSeconds": 2592000, "progressDeadlineSeconds": 2592000}
    job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "failurePolicy": longest}})
    probe = role_container(job, "rollout", OperatorSettings(default_redis_url="redis://r:6379/0"))["startupProbe"]
    assert probe["failureThreshold"] == 518400 < 2**31
    import datetime

    import torch.distributed as dist

    # the rollout worker's first connection waits that long for the actor's store (5e13 s failed at once)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=job.spec.failurePolicy.startup_limit_s))
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_queue_times_redis_cannot_take_are_refused(redis_url: str) -> None:
    # tensorTtlSeconds 1e16 passed validate; the first publish then failed in Redis ("value is not an integer or out
    # of range"), as XAUTOCLAIM did for claimIdleSeconds 1e17 ("Invalid min-idle-time argument")
    assert _lines({"transferQueue": {"tensorTtlSeconds": 1e18, "claimIdleSeconds": 1e17}}) == [
        "spec.transferQueue.tensorTtlSeconds: 1e+18 is invalid: must be <= 31536000",
        "spec.transferQueue.claimIdleSeconds: 1e+17 is invalid: must be <= 31536000"]
    import torch

    from omnirl.api.spec import TransferQueueSpec
    from omnirl.transfer import TransferQueue

    longest = TransferQueueSpec(tensorTtlSeconds=31536000, claimIdleSeconds=31535999)
    with TransferQueue.for_job("longest-times", longest, redis_url) as q:  # what validate lets through, Redis takes
        q.ensure_group(q.streams.requests, "g")
        q.publish(q.streams.requests, {"sample_id": "0:0:0"}, tensors={"x": torch.zeros(2)})
        [m] = q.consume(q.streams.requests, "g", "c", block_ms=0)
        assert 31535990 < q.redis.ttl(m.tensor_key) <= 31536000


def test_float16_weights_are_refused_because_adamw_turns_them_nan() -> None:
    # `dtype: float16` passed validate; one `omnirl run` step of ocr-nft then drew black images (held-out reward
    # 0.298 -> 0.000): AdamW on float16 weights, as the actor builds it, makes them non-finite
    import torch
    from tests.helpers import tiny_adapter

    module = tiny_adapter().module.to(torch.float16)
    params = list(module.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)  # actor/trainer.py's optimizer, its default eps 1e-8
    for p in params:
        p.grad = torch.full_like(p, 1e-5)  # a small gradient: its square underflows in float16
    optimizer.step()
    assert not any(torch.isfinite(p).any() for p in params)  # every weight inf or NaN
    assert _lines({"model": {"dtype": "float16"}}) == [
        'spec.model.dtype: "float16" is invalid: cannot be trained: the actor runs AdamW on the float16 weights (LoRA '
        "adapters too), whose eps (1e-8) and small second moments underflow to 0, so its first step makes the "
        "weights inf or NaN; use bfloat16 (float32's exponent range)"]
    assert RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "model": {"dtype": "bfloat16"}}})


def test_tensors_must_outlive_a_reclaim() -> None:
    # tensorTtlSeconds 0.001 passed validate; the reward worker then found every image expired (MissingTensors),
    # was restarted maxRestarts times and the job failed
    assert _lines({"transferQueue": {"tensorTtlSeconds": 60}}) == [
        "spec.transferQueue.tensorTtlSeconds: 60.0 is invalid: must be > claimIdleSeconds (60): a sample reclaimed "
        "from a dead consumer after claimIdleSeconds must still have its tensors, and a sample's image and "
        "trajectory must outlive its rollout, scoring and training step (default 3600)"]
    job = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "transferQueue": {
        "tensorTtlSeconds": 90, "claimIdleSeconds": 5}}})
    assert job.spec.transferQueue.tensorTtlSeconds == 90


def test_queue_times_below_their_floors_are_refused(redis_url: str) -> None:
    # tensorTtlSeconds 0.0005 with claimIdleSeconds 0.0001 passed validate; the queue sends Redis whole ms, so the
    # first publish's PX 0 failed ("invalid expire time in 'set' command") and the rollout worker was restarted
    # maxRestarts times; tensorTtlSeconds 2 (claimIdleSeconds 1) failed the CPU demo's first validation round
    # with MissingTensors, restarting the whole job
    assert _lines({"transferQueue": {"tensorTtlSeconds": 0.0005, "claimIdleSeconds": 0.0001}}) == [
        "spec.transferQueue.tensorTtlSeconds: 0.0005 is invalid: must be >= 60 seconds: a sample's tensors must "
        "outlive its rollout, scoring, training step and validation round (the CPU demo's round takes ~25 s; used "
        "tensors are deleted, a long TTL only keeps a crash's leftovers longer); the default is 3600"]
    assert _lines({"transferQueue": {"claimIdleSeconds": 0.5}}) == [
        "spec.transferQueue.claimIdleSeconds: 0.5 is invalid: must be >= 1 seconds: Redis takes it in whole ms "
        "(0.0005 was 0), and an entry a live consumer holds longer without renewing its claim (an engine step) is "
        "taken by another consumer's next read and done twice; the default is 60"]
    assert _lines({"transferQueue": {"tensorTtlSeconds": -1, "claimIdleSeconds": 0}})[0].startswith(
        "spec.transferQueue.tensorTtlSeconds: -1.0 is invalid: must be >= 60 seconds")
    import torch

    from omnirl.api.crd import build_crd
    from omnirl.api.spec import TransferQueueSpec
    from omnirl.transfer import TransferQueue

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    queue = schema["transferQueue"]["properties"]  # kubectl apply is refused by the API server too
    assert (queue["tensorTtlSeconds"]["minimum"], queue["claimIdleSeconds"]["minimum"]) == (60, 1)
    assert "exclusiveMinimum" not in queue["tensorTtlSeconds"]
    shortest = TransferQueueSpec(tensorTtlSeconds=60, claimIdleSeconds=1)
    with TransferQueue.for_job("shortest-times", shortest, redis_url) as q:  # what validate lets through, Redis takes
        q.ensure_group(q.streams.requests, "g")
        q.publish(q.streams.requests, {"sample_id": "0:0:0"}, tensors={"x": torch.zeros(2)})
        [m] = q.consume(q.streams.requests, "g", "c", block_ms=0)
        assert 0 < q.redis.pttl(m.tensor_key) <= 60_000


def test_resolutions_may_not_repeat_a_size() -> None:
    # [[256, 256], [256, 256]] passed validate: the groups took "both" sizes in turn, one size twice
    sd3 = {"family": "sd3", "path": "/m"}
    assert _lines({"model": {**sd3, "resolutions": [[256, 256], [384, 640], [256, 256]]}}) == [
        "spec.model.resolutions[2]: [256, 256] is invalid: repeats resolutions[0]: each size is listed once (groups "
        "take the sizes in turn); remove it or list another size"]
    assert _sd3_spec(resolutions=[[256, 256], [256, 512], [512, 256]]).model.resolution_for(2) == (512, 256)


def test_validation_needs_a_per_sample_reward() -> None:
    # with only a group-level reward, validation (one sample per prompt) reported val_reward_mean 0.0, unscored
    contrast = {"name": "contrast", "kind": "pairwise-contrast"}
    data = {"trainPrompts": "p.txt", "validationPrompts": "v.txt"}
    assert _lines({"data": data, "reward": [contrast]}) == [
        'spec.data.validationPrompts: "v.txt" is invalid: needs a per-sample reward: validation scores single '
        "samples and every reward is group-level (pairwise-contrast); add one (e.g. kind ocr) or remove "
        "validationPrompts"]
    RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "reward": [contrast]}})  # no validation: fine
    RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "data": data,
                                              "reward": [contrast, {"name": "ocr", "kind": "ocr", "weight": 0}]}})


@pytest.mark.parametrize("path", ["exports", "./exports/ckpt", "samples", ".", "logs"])
def test_a_checkpoint_dir_in_the_run_directorys_own_folders_is_refused(path: str) -> None:
    # `dir: exports` passed validate: the controller's export of step 0 replaced the checkpoint it read
    # (exports/step-000000), the actor could not resume and the job failed after maxRestarts restarts
    assert _lines({"checkpoint": {"dir": path}}) == [
        f'spec.checkpoint.dir: "{path}" is invalid: must not be the run directory itself nor in its exports, samples, '
        "logs, ledger, redis (the export of a checkpoint replaced it under exports/: the job restarted and failed); "
        "e.g. checkpoints"]
    assert RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "checkpoint": {"dir": "./ckpt/exports"}}})


def test_a_reward_named_like_a_step_statistic_is_refused() -> None:
    # `name: mean` passed validate; its raw mean then overwrote the step's weighted reward_mean (metrics.jsonl, the
    # RLJob's status.rewardMean, Prometheus) and val_reward_mean of every validation
    from omnirl.api.spec import RewardSpec
    from omnirl.controller.normalize import component_stats

    stats = {"reward_mean": 0.9}  # the controller's step stats, then updated with each component's (loop.py)
    stats.update(component_stats([RewardSpec.model_construct(name="mean", kind="jpeg")], [{"mean": 0.1}]))
    assert stats["reward_mean"] == 0.1
    for name in ("mean", "total"):  # total: the weighted sum's omnirl_reward_mean{reward="total"} series
        assert _lines({"reward": [{"name": name, "kind": "ocr"}]}) == [
            f'spec.reward[0].name: "{name}" is invalid: is reserved: metrics name each reward reward_<name>, '
            "val_reward_<name> and omnirl_reward_mean{reward=<name>}, and this one is the whole reward's (mean, std, "
            f"seconds, latency_seconds, total are taken); rename it, e.g. {name}-score"]


LORA_OFF = ("is invalid: LoRA is off (lora.enabled is not true), so {names} would be ignored and all weights "
            "trained; set lora.enabled: true to train LoRA adapters, or remove {names}")


@pytest.mark.parametrize(("lora", "written", "names"), [
    ({"rank": 8}, '{"rank": 8}', "rank"),
    ({"rank": 8, "alpha": 16, "targetModules": ["qkv"]}, '{"rank": 8, "alpha": 16.0, "targetModules": ["qkv"]}',
     "rank, alpha and targetModules"),
    ({"rank": 32}, '{"rank": 32}', "rank"),  # the default, but written without `enabled`: they believe LoRA is on
    ({"enabled": False, "alpha": 16.0}, '{"alpha": 16.0}', "alpha"),  # explicitly off: alpha 16 still does nothing
])
def test_lora_settings_without_lora_enabled_are_refused(lora: dict, written: str, names: str) -> None:
    # `lora: {rank: 8, alpha: 16}` without `enabled: true` passed validate, and `omnirl run` trained all weights
    # (weight sync 7471360 bytes: the full model, 37 modules) while the user believed rank-8 adapters were trained
    assert _lines({"model": {"lora": lora}}) == [f"spec.model.lora: {written} " + LORA_OFF.format(names=names)]
    on = RLJob.model_validate({**MINIMAL, "spec": {**MINIMAL["spec"], "model": {"lora": {**lora, "enabled": True}}}})
    assert on.spec.model.lora.enabled and on.spec.model.lora.ignored() == {}


def test_a_dumped_lora_off_block_still_loads() -> None:
    # dump_rljob writes every field: `enabled: false` beside the defaults (run directories' job.yaml, which
    # `omnirl export` and `omnirl eval` read back) sets nothing and stays valid
    job = job_from_dict(MINIMAL)
    dumped = dump_rljob(job)
    assert dumped["spec"]["model"]["lora"] == {"enabled": False, "rank": 32, "alpha": 64.0, "targetModules": []}
    assert job_from_dict(dumped) == job
    assert job_from_dict({**MINIMAL, "spec": {**MINIMAL["spec"], "model": {"lora": {"enabled": False, "rank": 32}}}})
