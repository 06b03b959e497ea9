"""The sandbox API server: Kubernetes' REST API over HTTP for the objects raysize touches.

`Api` holds the request logic (routing, verbs, preconditions, tables); `ApiServer` puts
it behind a threaded HTTP/1.1 server that the `kubernetes` client and `kubectl` use.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from raysize.sandbox import errors, events, launch_size, openapi, pods, tables
from raysize.sandbox.errors import ApiError
from raysize.sandbox.faults import Faults
from raysize.sandbox.patch import APPLY_PATCH, apply_config, apply_patch, decode_apply_config
from raysize.sandbox.rbac import Authorizer, Request
from raysize.sandbox.resources import (
    ALL,
    BY_GROUP,
    EVENTS,
    GROUP_VERSIONS,
    NAMESPACES,
    PODS,
    discovery_resource_list,
    patch_types,
    prepare_create,
    prepare_update,
    strategic_merge_allowed,
)
from raysize.sandbox.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from raysize.sandbox.store import INITIAL_END, Obj, ResourceType, Store, clone, dumps, rfc3339_in

log = logging.getLogger(__name__)

KUBE_VERSION = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0-raysize-sandbox",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-12-17T00:00:00Z",
    "goVersion": "go1.25.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
DEFAULT_USER = "system:admin"
# served without a store: a review is answered, never kept
SELF_SUBJECT_ACCESS_REVIEWS = ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]
QUANTITY_RULE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
# every patch type the server decodes; another is refused before any resource's handler
KNOWN_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    APPLY_PATCH,
)
WATCH_TIMEOUT_S = 1800.0


@dataclass
class Response:
    code: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None


@dataclass(frozen=True)
class Route:
    resource: ResourceType
    namespace: str
    name: str
    sub: str

    @property
    def label(self) -> str:
        return f"{self.resource.name}/{self.sub}" if self.sub else self.resource.name


def _json(code: int, obj: object, headers: dict[str, str] | None = None) -> Response:
    return Response(code, dumps(obj), dict(headers or {}))


def _error(e: ApiError) -> Response:
    if e.text is not None:  # a plain-text answer (APF's 429)
        body, headers = e.answer()
        return Response(e.code, body, headers)
    return Response(e.code, dumps(e.status()), dict(e.headers))


class Api:
    def __init__(
        self,
        store: Store | None = None,
        faults: Faults | None = None,
        minor: int = pods.DEFAULT_MINOR,
    ) -> None:
        self.minor = minor  # the Kubernetes minor whose rules apply (sandbox/pods.py)
        self.version = {
            **KUBE_VERSION,
            "minor": str(minor),
            "gitVersion": f"v1.{minor}.0-raysize-sandbox",
        }
        self.store = store or Store()
        self.faults = faults or Faults()
        self._denied: set[tuple[str, str]] = set()
        self.authorizer: Authorizer | None = None  # None: every client is system:admin
        self.requests = 0
        # requests served, by verb and resource ("patch", "pods/resize"): what a client
        # costs the server (bench.fleet_bench prints the burst's)
        self.tally: Counter[tuple[str, str]] = Counter()
        self._tally_lock = threading.Lock()
        self.stopping = threading.Event()
        self.store.create("namespaces", "", _namespace("default"))

    # --- RBAC stand-in --------------------------------------------------------------
    def deny(self, verb: str, resource: str) -> None:
        """Refuse `verb` on `resource` (e.g. "patch", "pods/resize") with a 403."""
        self._denied.add((verb, resource))

    def allow_all(self) -> None:
        self._denied.clear()

    # --- entry point ----------------------------------------------------------------
    def internal(self, method: str, path: str, body: object = None, content_type: str = "") -> Obj:
        """A request from a controller inside the sandbox: no faults, no RBAC; raises ApiError."""
        parts = [p for p in path.split("/") if p]
        route = self._route(parts)
        verb = _verb(method, route, {})
        headers = {"content-type": content_type} if content_type else {}
        raw = b"" if body is None else dumps(body)
        response = self._dispatch(verb, route, {}, headers, raw, None)
        result: Obj = json.loads(response.body)
        if response.code >= 400:
            raise ApiError(response.code, result.get("reason", ""), result.get("message", ""))
        return result

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        self.requests += 1
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = [p for p in url.path.split("/") if p]
        try:
            if parts == SELF_SUBJECT_ACCESS_REVIEWS:
                if method != "POST":
                    raise errors.method_not_allowed(method, "selfsubjectaccessreviews")
                return self._review(_decode(body))
            fixed = self._fixed(parts)
            if fixed is not None:
                if method != "GET":
                    raise errors.method_not_allowed(method, "")
                return fixed
            route = self._route(parts)
            verb = _verb(method, route, query)
            with self._tally_lock:
                self.tally[(verb, route.label)] += 1
            if (verb, route.label) in self._denied:
                raise errors.forbidden_request(
                    verb,
                    route.label,
                    route.name,
                    route.namespace,
                    DEFAULT_USER,
                    route.resource.group,
                )
            self._authorize(verb, route)
            decision = self.faults.decide(verb, route.label, route.name)
            if decision.latency_s:
                time.sleep(decision.latency_s)
            if decision.error is not None:
                raise decision.error
            return self._dispatch(
                verb, route, query, headers, body, decision.watch_disconnect_after_s
            )
        except ApiError as e:
            return _error(e)
        except Exception as exc:  # a bug here: answer 500, as the server's panic handler
            log.exception("%s %s failed", method, target)  # does, not a dropped connection
            return _error(errors.internal_error(f"{type(exc).__name__}: {exc}"))

    def _review(self, review: Obj) -> Response:
        """A SelfSubjectAccessReview, answered as the real server's RBAC answers it for the
        client (`authorizer`'s user, else system:admin, who may do anything; `deny` too).
        Every authenticated user may ask (system:basic-user), so it is never refused."""
        attrs = (review.get("spec") or {}).get("resourceAttributes") or {}
        resource = str(attrs.get("resource", ""))
        if attrs.get("subresource"):
            resource += f"/{attrs['subresource']}"
        verb = str(attrs.get("verb", ""))
        allowed = (verb, resource) not in self._denied
        if allowed and self.authorizer is not None:
            request = Request(
                verb,
                str(attrs.get("group", "")),
                resource,
                str(attrs.get("namespace", "")),
                str(attrs.get("name", "")),
            )
            allowed = self.authorizer.allows(request)
        return _json(
            201,
            {
                "kind": "SelfSubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": None},
                "spec": review.get("spec") or {},
                "status": {"allowed": allowed},
            },
        )

    def _authorize(self, verb: str, route: Route) -> None:
        authz = self.authorizer
        if authz is None:
            return
        r = route.resource
        if not authz.allows(Request(verb, r.group, route.label, route.namespace, route.name)):
            raise errors.forbidden_request(
                verb, route.label, route.name, route.namespace, authz.user, r.group
            )

    def _fixed(self, parts: list[str]) -> Response | None:
        path = "/" + "/".join(parts)
        if path == "/version":
            return _json(200, self.version)
        if path in ("/healthz", "/readyz", "/livez"):
            return Response(200, b"ok", {"Content-Type": "text/plain"})
        if path == "/api":
            return _json(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}
                    ],
                },
            )
        if path == "/apis":
            groups = []
            for g, v in GROUP_VERSIONS.items():
                if not g:
                    continue
                gv = {"groupVersion": f"{g}/{v}", "version": v}
                groups.append({"name": g, "versions": [gv], "preferredVersion": gv})
            return _json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if path == "/api/v1":
            return _json(200, discovery_resource_list(""))
        for g, v in GROUP_VERSIONS.items():
            if g and path == f"/apis/{g}":
                gv = {"groupVersion": f"{g}/{v}", "version": v}
                return _json(
                    200,
                    {
                        "kind": "APIGroup",
                        "apiVersion": "v1",
                        "name": g,
                        "versions": [gv],
                        "preferredVersion": gv,
                    },
                )
            if g and path == f"/apis/{g}/{v}":
                return _json(200, discovery_resource_list(g))
        if path == "/openapi/v3":
            return _json(200, openapi.root())
        if path.startswith("/openapi/v3/"):
            doc = openapi.document(path[len("/openapi/v3/") :])
            if doc is None:
                raise errors.page_not_found()
            return _json(200, doc)
        if path.startswith("/openapi"):
            raise errors.page_not_found()
        return None

    def _route(self, parts: list[str]) -> Route:
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis" and GROUP_VERSIONS.get(parts[1]) == parts[2]:
            group, rest = parts[1], parts[3:]
        else:
            raise errors.page_not_found()
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise errors.page_not_found()
        resource = BY_GROUP.get((group, rest[0]))
        if resource is None:
            raise errors.page_not_found()
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in resource.subresources:
            raise errors.page_not_found()
        if resource.namespaced and not namespace and name:
            raise errors.page_not_found()
        return Route(resource, namespace, name, sub)

    def _dispatch(
        self,
        verb: str,
        route: Route,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes,
        disconnect_after_s: float | None,
    ) -> Response:
        r = route.resource
        if verb == "get":
            obj = self.store.get(r.name, route.namespace, route.name)
            if _wants_table(headers):
                rv = obj["metadata"].get("resourceVersion", "")
                return _json(200, tables.table(r, [obj], rv, include=_include_object(query)))
            return Response(200, dumps(obj))
        if verb == "list":
            return self._list(route, query, headers)
        if verb == "watch":
            return self._watch(route, query, headers, disconnect_after_s)
        if verb == "create":
            return self._create(route, _decode(body), dry_run=query.get("dryRun") == "All")
        if verb == "update":
            return self._update(route, _decode(body))
        if verb == "patch":
            return self._patch(route, headers, query, body)
        if verb == "delete":
            return self._delete(route, query, body)
        if verb == "deletecollection":
            items, _ = self.store.list(r.name, route.namespace or None, self._filter(route, query))
            for item in items:
                try:
                    self._delete(
                        Route(
                            r, item["metadata"].get("namespace", ""), item["metadata"]["name"], ""
                        ),
                        {},
                        b"",
                    )
                except ApiError as err:
                    # deleted by someone else since the list (KubeRay, the kubelet): gone is
                    # what was asked, as the real server's deletecollection takes it
                    if err.code != 404:
                        raise
            return _json(200, _list_body(r, items, self.store.resource_version))
        raise errors.method_not_allowed(verb, r.name)

    # --- verbs ---------------------------------------------------------------------
    def _filter(self, route: Route, query: dict[str, str]) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"), route.resource.name)
        return lambda o: labels_match(labels, o) and fields_match(fields, o)

    def _list(self, route: Route, query: dict[str, str], headers: dict[str, str]) -> Response:
        r = route.resource
        accept = self._filter(route, query)
        entries, rv = self.store.list_raw(r.name, route.namespace or None, accept)
        limit = int(query.get("limit") or 0)
        cont = ""
        if query.get("continue"):
            # the next page starts after the last key sent, as the real server's does, so a
            # change in an earlier page shifts nothing; every page says the first one's
            # resourceVersion, where a watch picks up what changed since
            rv, after = _read_continue(query["continue"])
            if self.store.compacted(int(rv)):
                raise errors.gone(CONTINUE_EXPIRED)
            entries = [e for e in entries if _key(e.obj) > after]
        if limit and len(entries) > limit:
            entries = entries[:limit]
            cont = _continue_token(rv, _key(entries[-1].obj))
        if _wants_table(headers):
            include = _include_object(query)
            return _json(200, tables.table(r, [e.obj for e in entries], rv, cont, include=include))
        meta = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        if _wants_metadata(headers):
            return _json(
                200,
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    "items": [tables.partial_metadata(e.obj) for e in entries],
                },
            )
        head = dumps({"kind": f"{r.kind}List", "apiVersion": r.api_version, "metadata": meta})[:-1]
        body = head + b',"items":[' + b",".join(e.bytes() for e in entries) + b"]}"
        return Response(200, body)

    def _watch(
        self,
        route: Route,
        query: dict[str, str],
        headers: dict[str, str],
        disconnect_after_s: float | None,
    ) -> Response:
        r = route.resource
        accept = self._filter(route, query)
        if route.name:
            name = route.name
            base = accept
            accept = lambda o: o["metadata"]["name"] == name and base(o)  # noqa: E731
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        initial = query.get("sendInitialEvents") in ("true", "1")
        try:
            watcher = self.store.watch(
                r.name,
                route.namespace or None,
                accept,
                query.get("resourceVersion"),
                mark_initial_end=initial and bookmarks,
            )
        except ApiError as e:
            # A watch from a compacted revision answers 200 and one ERROR event (410).
            return Response(
                200,
                b"",
                {"Content-Type": "application/json"},
                iter([dumps({"type": "ERROR", "object": e.status()}) + b"\n"]),
            )
        timeout = float(query.get("timeoutSeconds") or WATCH_TIMEOUT_S)
        if disconnect_after_s is not None:
            timeout = min(timeout, disconnect_after_s)
        deadline = time.monotonic() + timeout
        store, stopping = self.store, self.stopping
        # As Tables (kubectl get -w): every event's object is a one-row Table, and only
        # the first carries the column definitions (the server's watch drops them after
        # it; kubectl keeps the first ones). ERROR events stay Status objects.
        as_table = _wants_table(headers)
        include = _include_object(query)
        sent_headers = False

        def event(kind: str, obj: Obj) -> bytes:
            nonlocal sent_headers
            if not as_table:
                return b'{"type":"' + kind.encode() + b'","object":' + dumps(obj) + b"}\n"
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            try:
                converted = tables.table(r, [obj], rv, headers=not sent_headers, include=include)
            except Exception:  # the server's watch sends the object as it is, and says so
                log.exception("failed to transform %s %s to a Table", r.kind, rv)
                return dumps({"type": kind, "object": obj}) + b"\n"
            sent_headers = True
            return dumps({"type": kind, "object": converted}) + b"\n"

        def bookmark(rv: str, annotations: dict[str, str] | None = None) -> bytes:
            meta: Obj = {"resourceVersion": rv}
            if annotations:
                meta["annotations"] = annotations
            return event(
                "BOOKMARK", {"kind": r.kind, "apiVersion": r.api_version, "metadata": meta}
            )

        sent_rv = 0  # the newest event this watch sent

        def emit(item: tuple[str, Obj]) -> Iterator[bytes]:
            nonlocal sent_rv
            kind, obj = item
            if kind == INITIAL_END:
                rv = obj["metadata"]["resourceVersion"]
                yield bookmark(rv, {"k8s.io/initial-events-end": "true"})
                return
            if not accept(obj):
                return
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if rv.isdigit():
                sent_rv = max(sent_rv, int(rv))
            yield event(kind, obj)

        def ending() -> Iterator[bytes]:
            """Like the watch cache: where the watch ends, say how far it got. Every event
            the store queued for it up to that revision goes first (they are queued under
            the store's lock): a bookmark past events not sent had the client resume after
            them, and its cache missed them for good (a deleted pod kept, #43)."""
            with store.lock:
                rv = int(store.resource_version)
            while True:
                try:
                    item = watcher.events.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    return
                yield from emit(item)
            yield bookmark(str(max(rv, sent_rv)))

        def lines() -> Iterator[bytes]:
            try:
                while not stopping.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if bookmarks and disconnect_after_s is None:
                            yield from ending()
                        return
                    try:
                        item = watcher.events.get(timeout=min(left, 0.5))
                    except queue.Empty:
                        continue
                    if item is None:
                        return
                    yield from emit(item)
            finally:
                store.unwatch(watcher)

        return Response(200, b"", {"Content-Type": "application/json"}, lines())

    def _create(self, route: Route, obj: Any, dry_run: bool = False) -> Response:
        """Create through the resource's strategy; a dry run (`dryRun=All`) checks
        everything (the namespace exists, the object is valid) and stores nothing."""
        r = route.resource
        if route.name or route.sub:
            raise errors.method_not_allowed("create", r.name)
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        if r is EVENTS:
            _decode_event(obj)
        meta = obj.setdefault("metadata", {})
        if r.namespaced:
            ns = meta.get("namespace") or route.namespace
            if meta.get("namespace") and meta["namespace"] != route.namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            if self.store.find("namespaces", "", ns) is None:
                raise errors.not_found("namespaces", ns)
            meta["namespace"] = ns
        else:
            ns = ""
        for key in ("resourceVersion", "uid", "creationTimestamp", "deletionTimestamp"):
            meta.pop(key, None)
        if r is PODS:  # mutating admission: deploy/'s launch-size policy (sandbox/launch_size.py)
            launch_size.admit(obj, self.store.find("configmaps", ns, launch_size.CONFIGMAP))
        prepare_create(r, obj, self.minor)
        if dry_run:
            if self.store.find(r.name, ns, meta.get("name", "")) is not None:
                raise errors.already_exists(r.name, meta.get("name", ""), r.group)
            return Response(201, dumps(obj))
        created = self.store.create(r.name, ns, obj)
        return Response(201, dumps(created))

    def _write(self, route: Route, change: Callable[[Obj], Obj], dry_run: bool = False) -> Response:
        """Read-modify-write through the resource's strategy. A dry run (`dryRun=All`)
        goes through everything, admission included, and stores nothing."""
        r = route.resource
        if not route.name:
            raise errors.method_not_allowed("update", r.name)

        def mutate(current: Obj) -> Obj:
            current_rv = current["metadata"]["resourceVersion"]
            uid = current["metadata"].get("uid")
            new = change(current)
            if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
                raise errors.bad_request("the body of the request is not a JSON object")
            meta = new.setdefault("metadata", {})
            want = meta.get("resourceVersion")
            if want not in (None, "") and str(want) != current_rv:
                raise errors.conflict(r.name, route.name, r.group)
            if meta.get("name", route.name) != route.name:
                raise errors.bad_request(
                    "the name of the object "
                    f"({meta.get('name')}) does not match the name on the URL ({route.name})"
                )
            meta["name"] = route.name
            if r.namespaced:
                meta["namespace"] = route.namespace
            # a UID other than the stored one: immutable, checked before the kind's rules
            sent_uid = meta.get("uid")
            wrong_uid = errors.uid_changed(sent_uid) if sent_uid not in (None, "", uid) else []
            try:
                prepare_update(r, route.sub, current, new, self.minor)
            except ApiError as err:
                if wrong_uid:
                    raise errors.checked_first(
                        err, wrong_uid, r.kind, route.name, r.group
                    ) from None
                raise
            if wrong_uid:
                raise errors.invalid_object(r.kind, route.name, wrong_uid, r.group)
            if r is PODS and route.sub == "resize" and self.minor >= 36:
                node = (current.get("spec") or {}).get("nodeName")
                pods.admit_resize(current, new, node and self.store.find("nodes", "", node))
            meta = new["metadata"]
            meta.pop("resourceVersion", None)
            return new

        if dry_run:
            with self.store.lock:
                current = self.store.get(r.name, route.namespace, route.name)
                would_be = mutate(clone(current))
                would_be["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            return Response(200, dumps(would_be))
        updated = self.store.update(r.name, route.namespace, route.name, mutate)
        return Response(200, dumps(updated))

    def _update(self, route: Route, body: Any) -> Response:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request is not a JSON object")
        if route.resource is EVENTS:
            _decode_event(body)
        r = route.resource

        def replace(current: Obj) -> Obj:
            # a PUT's UID is a precondition (`rest.DefaultUpdatedObjectInfo.Preconditions`),
            # checked by the storage layer before anything else
            sent, stored = (body.get("metadata") or {}).get("uid"), current["metadata"].get("uid")
            if sent and sent != stored:
                raise errors.uid_precondition(
                    r.name, route.namespace, route.name, sent, stored, r.group
                )
            return body

        return self._write(route, replace)

    def _patch(
        self, route: Route, headers: dict[str, str], query: dict[str, str], body: bytes
    ) -> Response:
        r = route.resource
        content_type = headers.get("content-type", "").split(";")[0].strip()
        if content_type not in KNOWN_PATCH_TYPES:  # the handler never got it: a bare 415
            raise errors.unsupported_media_type_bare()
        if content_type not in patch_types(r):
            raise errors.unsupported_media_type(patch_types(r))
        _validate_patch_options(content_type, query)
        if content_type == APPLY_PATCH:
            return self._apply(route, body)
        patch = _decode(body)

        def change(current: Obj) -> Obj:
            patched = apply_patch(content_type, clone(current), patch)
            if r is EVENTS and isinstance(patched, dict):
                try:
                    events.decode_event_times(patched)
                except events.DecodeError as exc:
                    raise _undecodable_patch(content_type, patch, patched, str(exc)) from None
            return patched

        try:
            return self._write(route, change, dry_run=query.get("dryRun") == "All")
        except ApiError as err:
            if err.code == 400 and "quantities must match" in err.message:
                # a patch that does not decode is the patch's fault: 422 on field "patch"
                raise errors.invalid_patch(patch, QUANTITY_RULE) from None
            raise

    def _apply(self, route: Route, body: bytes) -> Response:
        """Server-side apply (first apply of a manager; no managedFields, no conflicts)."""
        r = route.resource
        config = decode_apply_config(body)
        associative = strategic_merge_allowed(r)
        if (
            not route.sub
            and route.name
            and self.store.find(r.name, route.namespace, route.name) is None
        ):
            # Apply creates a missing object (not through a subresource: that is a 404).
            obj = apply_config({}, config, r.api_version, associative=associative)
            if r is EVENTS:
                _decode_applied_event(route.name, obj)
            meta = obj.setdefault("metadata", {})
            if meta.setdefault("name", route.name) != route.name:
                raise errors.bad_request(
                    "the name of the object "
                    f"({meta.get('name')}) does not match the name on the URL ({route.name})"
                )
            return self._create(Route(r, route.namespace, "", ""), obj)

        def change(current: Obj) -> Obj:
            applied = apply_config(clone(current), config, r.api_version, associative=associative)
            if r is EVENTS:
                _decode_applied_event(route.name, applied)
            return applied

        return self._write(route, change)

    def _delete(self, route: Route, query: dict[str, str], body: bytes) -> Response:
        r = route.resource
        options = _decode(body) if body.strip() else {}
        if not isinstance(options, dict):
            options = {}
        preconditions = options.get("preconditions") or {}
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        # One lock for the whole deletion: the preconditions hold for the object removed
        with self.store.lock:
            current = self.store.get(r.name, route.namespace, route.name)
            _check_delete_preconditions(r, current, preconditions)
            if r is PODS:
                bound = bool((current.get("spec") or {}).get("nodeName"))
                finished = (current.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                seconds = int(
                    grace
                    if grace is not None
                    else (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                )
                if bound and not finished and seconds > 0:

                    def terminate(pod: Obj) -> Obj:
                        # rest.BeforeDelete: the first graceful deletion sets the timestamp
                        # (when the grace period ends) and bumps the generation.
                        meta = pod["metadata"]
                        if not meta.get("deletionTimestamp"):
                            meta["deletionTimestamp"] = rfc3339_in(seconds)
                            meta["deletionGracePeriodSeconds"] = seconds
                            if meta.get("generation", 0) > 0:
                                meta["generation"] += 1
                        return pod

                    updated = self.store.update(r.name, route.namespace, route.name, terminate)
                    return Response(200, dumps(updated))
            if r is NAMESPACES:
                if route.name == "default":
                    raise errors.ApiError(
                        403,
                        "Forbidden",
                        'namespaces "default" is forbidden: this namespace may not be deleted',
                    )
                for other in ALL:  # the namespace controller's job, done at once
                    if other.namespaced:
                        items, _ = self.store.list(other.name, route.name)
                        for item in items:
                            self.store.remove(
                                other.name, route.name, item["metadata"]["name"], finalize=False
                            )
            removed = self.store.remove(r.name, route.namespace, route.name)
        kept = bool(removed["metadata"].get("finalizers"))  # only marked as deleting
        if r is PODS or r.group or kept:
            return Response(200, dumps(removed))
        return _json(
            200,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": route.name, "kind": r.name, "uid": removed["metadata"]["uid"]},
            },
        )


def _namespace(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def _list_body(r: ResourceType, items: list[Obj], rv: str) -> Obj:
    return {
        "kind": f"{r.kind}List",
        "apiVersion": r.api_version,
        "metadata": {"resourceVersion": rv},
        "items": items,
    }


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError as exc:
        raise errors.bad_request(f"error decoding body: {exc}") from exc


def _decode_event(obj: Obj) -> None:
    """A created or replaced Event's times, as the server's decoding reads them: stored
    canonically, or the request fails with Go's error (400)."""
    try:
        events.decode_event_times(obj)
    except events.DecodeError as exc:
        raise errors.bad_request(events.handled_as(str(exc))) from None


def _decode_applied_event(name: str, obj: Obj) -> None:
    """Server-side apply converts its result to the typed Event: a time that does not
    parse is a 500 there (the apply handler's conversion error), not a 400."""
    try:
        events.decode_event_times(obj)
    except events.DecodeError as exc:
        raise ApiError(500, "", events.apply_conversion_error(name, str(exc))) from None


def _undecodable_patch(content_type: str, patch: Any, patched: Obj, detail: str) -> ApiError:
    """A patch whose result does not decode: 422 on field "patch". A strategic merge
    patch is quoted as Go prints the patch; a JSON or merge patch by the patched
    document's JSON (its top-level keys sorted, as the server's patcher leaves them)."""
    if content_type == "application/strategic-merge-patch+json":
        return errors.invalid_patch(patch, detail)
    quoted = (
        "{"
        + ",".join(f"{json.dumps(k)}:{dumps(patched[k]).decode()}" for k in sorted(patched))
        + "}"
    )
    error = errors.FieldError("patch", "Invalid value", detail, quoted, True)
    return ApiError(422, "Invalid", f' "" is invalid: {error}', {"causes": [error.cause()]})


def _check_delete_preconditions(r: ResourceType, current: Obj, preconditions: Obj) -> None:
    """`rest.BeforeDelete`: the UID, then the resourceVersion, must match the stored object.
    The conflict names the kind (`Pod`), not the resource, as the real server's does."""
    meta = current["metadata"]
    for key, label, tail in (
        ("uid", "UID", "deleted and then recreated"),
        ("resourceVersion", "ResourceVersion", "modified"),
    ):
        want = preconditions.get(key)
        if want is not None and want != meta.get(key):
            raise errors.conflict(
                r.kind,
                meta["name"],
                r.group,
                f"the {label} in the precondition ({want}) does not match the {label} in record "
                f"({meta.get(key)}). The object might have been {tail}",
            )


def _validate_patch_options(content_type: str, query: dict[str, str]) -> None:
    """`ValidatePatchOptions`: apply needs a field manager; only apply may force."""
    errs: list[errors.FieldError] = []
    if content_type != APPLY_PATCH:
        if "force" in query:
            errs.append(errors.forbidden("force", "may not be specified for non-apply patch"))
    elif not query.get("fieldManager"):
        errs.append(errors.required("fieldManager", "is required for apply patch"))
    if errs:
        raise errors.invalid_object("PatchOptions", "", errs, "meta.k8s.io")


def _verb(method: str, route: Route, query: dict[str, str]) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if route.name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if route.name else "deletecollection"
    raise errors.method_not_allowed(method, route.resource.name)


def _include_object(query: dict[str, str]) -> str:
    """`includeObject` of a Table request (`Metadata` unless it names another)."""
    value = query.get("includeObject") or "Metadata"
    return value if value in tables.INCLUDE_OBJECT else "Metadata"


def _wants_table(headers: dict[str, str]) -> bool:
    accept = headers.get("accept", "")
    first = accept.split(",")[0]
    return "as=Table" in first


CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You "
    "can start a new list without the continue parameter."
)


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _continue_token(rv: str, last: tuple[str, str]) -> str:
    """Opaque to clients, as the real server's is: the list's revision and the last key
    sent."""
    body = json.dumps({"rv": rv, "after": list(last)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode()


def _read_continue(token: str) -> tuple[str, tuple[str, str]]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        rv, (ns, name) = str(int(doc["rv"])), doc["after"]
        return rv, (str(ns), str(name))
    except (ValueError, TypeError, KeyError) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc


def _wants_metadata(headers: dict[str, str]) -> bool:
    """A list asked for as meta.k8s.io's PartialObjectMetadataList (client-go's metadata
    client). The real server also answers `as=PartialObjectMetadata` for one object; no
    caller here asks that."""
    first = headers.get("accept", "").split(",")[0]
    return "as=PartialObjectMetadataList" in first


# --- HTTP transport ------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = -1  # buffered: headers and body leave in one send when the request ends
    server_version = "raysize-sandbox"
    sys_version = ""
    api: Api

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        response = self.api.handle(self.command, self.path, headers, body)
        self.send_response(response.code)
        self.send_header("Content-Type", response.headers.pop("Content-Type", "application/json"))
        self.send_header("Audit-Id", "00000000-0000-0000-0000-000000000000")
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in response.headers.items():
            self.send_header(k, v)
        if response.stream is None:
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        try:
            for chunk in response.stream:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            close = getattr(response.stream, "close", None)
            if close is not None:
                close()
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (its timeout fired) is not a server error.
        log.debug("connection from %s ended abruptly", client_address, exc_info=True)


class ApiServer:
    """The API server on a local port, served from a background thread."""

    def __init__(self, api: Api, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api
        handler = type("Handler", (_Handler,), {"api": api})
        self._server = _Server((host, port), handler)
        self._server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="sandbox-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.api.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


__all__ = ["ALL", "Api", "ApiServer", "Response", "clone"]
