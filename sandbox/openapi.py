"""Just enough OpenAPI v3 for `kubectl` to see that the server validates fields itself.

kubectl's `--validate=strict` (the default) asks `/openapi/v3` whether the PATCH
operation of a kind takes the `fieldValidation` query parameter; if so, it leaves
validation to the server instead of downloading full schemas.
"""

from __future__ import annotations

from typing import Any

from raysize.sandbox.resources import ALL, GROUP_VERSIONS

Obj = dict[str, Any]


def _gv_path(group: str) -> str:
    return f"api/{GROUP_VERSIONS[group]}" if not group else f"apis/{group}/{GROUP_VERSIONS[group]}"


def root() -> Obj:
    return {
        "paths": {
            _gv_path(g): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g)}?hash=sandbox"}
            for g in GROUP_VERSIONS
        }
    }


def document(gv_path: str) -> Obj | None:
    group = next((g for g in GROUP_VERSIONS if _gv_path(g) == gv_path), None)
    if group is None:
        return None
    version = GROUP_VERSIONS[group]
    params = [
        {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for name in ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")
    ]
    paths: Obj = {}
    for r in ALL:
        if r.group != group:
            continue
        prefix = "/" + gv_path + ("/namespaces/{namespace}" if r.namespaced else "")
        gvk = {"group": group, "version": version, "kind": r.kind}
        for suffix in ["", *[f"/{s}" for s in r.subresources]]:
            paths[f"{prefix}/{r.name}/{{name}}{suffix}"] = {
                "patch": {
                    "operationId": f"patch{r.kind}{suffix.strip('/').capitalize()}",
                    "parameters": params,
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                },
                "put": {
                    "parameters": params,
                    "x-kubernetes-action": "put",
                    "x-kubernetes-group-version-kind": gvk,
                },
            }
        paths[f"{prefix}/{r.name}"] = {
            "post": {
                "parameters": params,
                "x-kubernetes-action": "post",
                "x-kubernetes-group-version-kind": gvk,
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0-raysize-sandbox"},
        "paths": paths,
        "components": {"schemas": {}},
    }
