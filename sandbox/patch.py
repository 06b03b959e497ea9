"""The patch formats the API server accepts: JSON patch, merge patch, strategic merge, apply.

Strategic merge knows the merge keys of the pod and RayCluster fields raysize and
kubectl touch (`containers` by `name`, `conditions` by `type`, ...); any other list is
replaced, as for a field without a patch strategy.

Server-side apply is approximated for a first apply by one field manager: the
configuration is merged into the live object (associative lists by their keys for
built-in kinds, maps merged and lists replaced for custom resources, whose lists are
atomic unless their schema says otherwise). The sandbox keeps no managedFields, so it
neither reports conflicts with other managers (a real server answers 409 unless
`force=true`) nor removes fields a manager applied before and now leaves out.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from raysize.sandbox.errors import ApiError, bad_request, unprocessable

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Field name → merge key, for lists patched by merging (patchStrategy:"merge").
_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "conditions": "type",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "workerGroupSpecs": "groupName",
}
# (parent field, field) → merge key, where the same field name has another key elsewhere:
# a Service's `spec.ports` merge by `port`, a container's `ports` by `containerPort`.
_MERGE_KEYS_UNDER: dict[tuple[str, str], str] = {("spec", "ports"): "port"}
# Lists of scalars merged as sets (patchStrategy:"merge" on a primitive list).
_MERGED_PRIMITIVE_LISTS = {"finalizers"}


class _Missing:
    pass


_MISSING = _Missing()


def decode_apply_config(body: bytes) -> dict[str, Any]:
    """An apply configuration: YAML, of which JSON (what clients send) is a subset."""
    try:
        config = json.loads(body or b"null")
    except ValueError:
        import yaml  # PyYAML comes with `kubernetes`

        try:
            config = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            raise bad_request(f"error decoding YAML: {exc}") from exc
    if config is None:
        return {}  # an empty document: refused below for its missing apiVersion
    if not isinstance(config, dict):
        kind = {list: "array", str: "string", bool: "bool"}.get(type(config), "number")
        raise bad_request(
            "error decoding YAML: error unmarshaling JSON: while decoding JSON: json: cannot "
            f"unmarshal {kind} into Go value of type map[string]interface {{}}"
        )
    return config


def apply_config(
    target: dict[str, Any], config: dict[str, Any], api_version: str, *, associative: bool
) -> dict[str, Any]:
    """Merge an apply configuration into `target` (see the module docstring for limits)."""
    if config.get("apiVersion") != api_version:
        raise bad_request(
            "Incorrect version specified in apply patch. Specified patch version: "
            f"{config.get('apiVersion') or ''}, expected: {api_version}"
        )
    if (config.get("metadata") or {}).get("managedFields") is not None:
        raise bad_request("metadata.managedFields must be nil")
    merged = strategic_merge_patch(target, config) if associative else merge_patch(target, config)
    if not isinstance(merged, dict):  # a top-level "$patch": "delete" leaves no object
        raise bad_request("apply did not produce an object")
    return merged


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply `patch` of `content_type` to `target` (which may be changed) and return the result."""
    if content_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise bad_request(
            "json: cannot unmarshal array into Go value of type map[string]interface {}"
        )
    if content_type == MERGE_PATCH:
        out = merge_patch(target, patch)
    else:
        out = strategic_merge_patch(target, patch)
    if not isinstance(out, dict):  # pragma: no cover - a dict patch on a dict stays a dict
        raise bad_request("patch did not produce an object")
    return out


# --- RFC 7386 merge patch ---------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- strategic merge patch ----------------------------------------------------------------
def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return _MISSING
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive}")
    out = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if key.startswith("$setElementOrder/") or key.startswith("$deleteFromPrimitiveList/"):
            continue
        if value is None:
            out.pop(key, None)
            continue
        current = out.get(key)
        merge_key = _MERGE_KEYS_UNDER.get((field, key)) or _MERGE_KEYS.get(key)
        if isinstance(value, list) and merge_key and isinstance(current, list):
            out[key] = _merge_list(current, value, merge_key, key)
        elif (
            isinstance(value, list) and key in _MERGED_PRIMITIVE_LISTS and isinstance(current, list)
        ):
            out[key] = current + [v for v in value if v not in current]
        elif isinstance(value, list):
            out[key] = [
                v for v in (strategic_merge_patch(None, e, key) for e in value) if v is not _MISSING
            ]
        else:
            merged = strategic_merge_patch(current, value, key)
            if merged is _MISSING:
                out.pop(key, None)
            else:
                out[key] = merged
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/") and isinstance(value, list):
            name = key.split("/", 1)[1]
            if isinstance(out.get(name), list):
                out[name] = [v for v in out[name] if v not in value]
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(current: list[Any], patch: list[Any], key: str, field: str) -> list[Any]:
    out = [copy.deepcopy(e) for e in current]
    for element in patch:
        if not isinstance(element, dict):
            raise bad_request(f"{field}: merging an object in json but data type is not struct")
        directive = element.get("$patch")
        if directive == "replace":
            return [
                {k: copy.deepcopy(v) for k, v in e.items() if k != "$patch"}
                for e in patch
                if isinstance(e, dict)
            ]
        if key not in element:
            raise ApiError(
                400,
                "BadRequest",
                f"map: {element} does not contain declared merge key: {key}",
            )
        index = next(
            (i for i, e in enumerate(out) if isinstance(e, dict) and e.get(key) == element[key]),
            None,
        )
        if directive == "delete":
            if index is not None:
                out.pop(index)
            continue
        if index is None:
            out.append({k: copy.deepcopy(v) for k, v in element.items() if k != "$patch"})
        else:
            merged = strategic_merge_patch(out[index], element, field)
            out[index] = merged
    return out


# --- RFC 6902 JSON patch ----------------------------------------------------------------
def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise unprocessable(f"Unable to parse path {path!r}")
    return [_unescape(t) for t in path[1:].split("/")]


def _parent(doc: Any, tokens: list[str], op: str, path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise unprocessable(
                    f'{op} operation does not apply: doc is missing path: "{path}": missing value'
                )
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(token, len(node), path, op)]
        else:
            raise unprocessable(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
    return node


def _index(token: str, size: int, path: str, op: str, *, allow_end: bool = False) -> int:
    if token == "-" and allow_end:
        return size
    if not token.isdigit():
        raise unprocessable(f"Unable to access invalid index: {token}")
    i = int(token)
    limit = size if allow_end else size - 1
    if i > limit:
        raise unprocessable(f"Unable to access invalid index: {i}")
    return i


def json_patch(target: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    """Apply `ops` to `target` in place (the store hands every writer its own copy)."""
    doc: Any = target
    for raw in ops:
        if not isinstance(raw, dict) or "op" not in raw:
            raise bad_request("json patch operation is missing 'op'")
        op = raw["op"]
        path = raw.get("path")
        if not isinstance(path, str):
            raise unprocessable(f"operation missing path: {raw}")
        tokens = _split(path)
        if op in ("add", "replace", "test") and "value" not in raw:
            raise unprocessable(f"operation missing value: {op} {path}")
        value = copy.deepcopy(raw.get("value"))
        if op == "test":
            if _get(doc, tokens, path, op) != value:
                raise unprocessable(f"testing value {path} failed: test failed", cause=False)
            continue
        if op in ("move", "copy"):
            source = raw.get("from")
            if not isinstance(source, str):
                raise unprocessable(f"operation missing from: {op} {path}")
            value = copy.deepcopy(_get(doc, _split(source), source, op))
            if op == "move":
                doc = _remove(doc, _split(source), source, op)
            op = "add"
        if not tokens:
            if op in ("add", "replace"):
                doc = value
                continue
            raise unprocessable(f"{op} operation does not apply on the whole document")
        parent = _parent(doc, tokens, op, path)
        last = tokens[-1]
        if op == "add":
            if isinstance(parent, dict):
                parent[last] = value
            elif isinstance(parent, list):
                parent.insert(_index(last, len(parent), path, op, allow_end=True), value)
            else:
                raise unprocessable(f"add operation does not apply: doc is missing path: {path}")
        elif op == "replace":
            if isinstance(parent, dict):
                # json-patch v4 (the API server's) replaces a missing object member too;
                # Ray's KubeRay provider relies on it for `scaleStrategy`
                parent[last] = value
            elif isinstance(parent, list):
                parent[_index(last, len(parent), path, op)] = value
            else:
                raise unprocessable(
                    f"replace operation does not apply: doc is missing path: {path}"
                )
        elif op == "remove":
            doc = _remove(doc, tokens, path, op)
        else:
            raise unprocessable(f"Unexpected kind: {op}")
    if not isinstance(doc, dict):
        raise unprocessable("the patch replaced the object with a non-object")
    return doc


def _get(doc: Any, tokens: list[str], path: str, op: str) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(token, len(node), path, op)]
        else:
            raise unprocessable(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
    return node


def _remove(doc: Any, tokens: list[str], path: str, op: str) -> Any:
    parent = _parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise unprocessable(
                f'remove operation does not apply: doc is missing path: "{path}": missing value'
            )
        del parent[last]
    elif isinstance(parent, list):
        parent.pop(_index(last, len(parent), path, op))
    else:
        raise unprocessable(f"remove operation does not apply: doc is missing path: {path}")
    return doc
