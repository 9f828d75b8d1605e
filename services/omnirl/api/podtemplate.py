"""Shape checks of a user pod template (`roles.<role>.template`, `reward[].server.template`).

The operator merges the template over the pod it builds (containers by `name`). The API server
refuses a container without an image and ignores a field outside `metadata`/`spec` of a
PodTemplateSpec, so a misspelt container name or a forgotten `spec:` level would pass
`omnirl validate` and then never start the role, or silently drop a node selector.
"""

from __future__ import annotations

from typing import Any

from omnirl.api.errors import FieldProblem

POD_TEMPLATE_FIELDS = ("metadata", "spec")


def check_pod_template(template: dict[str, Any], container: str, path: str) -> None:
    """Refuse a pod template the operator's merge would turn into a pod that cannot run as meant.

    Args:
        template: the user's PodTemplateSpec (a mapping; `metadata` and `spec`).
        container: name of the generated container the template merges into (`rollout`, `judge` ...).
        path: field path of `template`, relative to the model whose validator calls this
            (e.g. `rollout.template`), used in the error.

    Raises:
        FieldProblem: a key other than `metadata`/`spec` at the top (fix: move it under `spec`);
            `spec`/`metadata` not a mapping; `spec.containers` not a list of mappings with a `name`;
            a container whose name is not `container` and that has no `image` (a misspelt name
            would add an image-less sidecar the API server refuses).
    """
    for key, value in template.items():
        if key not in POD_TEMPLATE_FIELDS:
            raise FieldProblem(f"{path}.{key}", value, "a pod template holds only metadata and spec (Kubernetes "
                               f"ignores anything else); move it under spec: template: {{spec: {{{key}: ...}}}}")
        if not isinstance(value, dict):
            raise FieldProblem(f"{path}.{key}", value, "must be a mapping")
    containers = template.get("spec", {}).get("containers")
    if containers is None:
        return
    if not isinstance(containers, list):
        raise FieldProblem(f"{path}.spec.containers", containers, f"must be a list, e.g. [{{name: {container}, "
                           "resources: {...}}]")
    for i, item in enumerate(containers):
        where = f"{path}.spec.containers[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise FieldProblem(where, item, f"must be a mapping with a name: {container} to change the generated "
                               "container, another name (and an image) for a sidecar")
        if item["name"] != container and not item.get("image"):
            raise FieldProblem(f"{where}.name", item["name"], f"is not the generated container ({container}) and "
                               f"has no image, so the pod would be refused; name it {container} to merge into that "
                               "container, or give the sidecar an image")
