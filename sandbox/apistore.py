"""The kubelet's view of the cluster through the Kubernetes API, for any API server.

`ApiStore` offers the few `Store` calls the kubelet simulator makes (find, get, create,
update with a mutator, remove, watch) as HTTP calls to an API server named by a
kubeconfig: the embedded sandbox server or a real kube-apiserver. An update is a
read-modify-write guarded by resourceVersion, split as a kubelet writes: a new
`spec.nodeName` goes through `pods/<name>/binding` (what the scheduler does, for a kubelet
that binds pods itself), everything else the kubelet changes goes through
`pods/<name>/status`, and a node's update through `nodes/<name>/status`; a 409 Conflict
re-reads and runs the mutator again. A watch lists, then watches from the list's
resourceVersion with bookmarks, and lists again after a 410 Gone, feeding the same event
queue as the store's.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import logging
import socket
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import yaml

from raysize.sandbox.errors import ApiError
from raysize.sandbox.store import Watcher

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MAX_CONFLICT_RETRIES = 20
WATCH_TIMEOUT_S = 300


def _path(resource: str, namespace: str, name: str = "") -> str:
    base = "/api/v1"
    tail = f"/{name}" if name else ""
    if resource in ("nodes", "namespaces"):
        return f"{base}/{resource}{tail}"
    return f"{base}/namespaces/{namespace}/{resource}{tail}"


class KubeHttp:
    """Bearer-token JSON calls to one API server (HTTPS checked against `ca_pem`)."""

    def __init__(self, server: str, token: str = "", ca_pem: bytes | None = None) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.context: ssl.SSLContext | None = None
        if self.server.startswith("https://"):
            self.context = ssl.create_default_context(
                cadata=ca_pem.decode() if ca_pem is not None else None
            )

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path) -> KubeHttp:
        """The API server of a kubeconfig's current context, with its token and CA."""
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        ca: bytes | None = None
        if "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"])
        elif "certificate-authority" in cluster:
            ca = Path(cluster["certificate-authority"]).read_bytes()
        return cls(cluster["server"], user.get("token", ""), ca)

    def open(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.server + path, data=data, headers=headers, method=method)
        try:
            resp: HTTPResponse = urllib.request.urlopen(req, context=self.context, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise _api_error(err) from None
        return resp

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        with self.open(method, path, body, **kw) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None


def _hang_up(resp: HTTPResponse | None) -> None:
    """End a watch's connection from another thread. A watch left open after its watcher
    stopped kept kube-apiserver from exiting on SIGTERM: it waits for open requests, so
    every real world took the 10 s grace to stop, then a SIGKILL. Shutting the socket down
    wakes the reading thread at once (closing the response would not)."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _api_error(err: urllib.error.HTTPError) -> ApiError:
    try:
        status = json.loads(err.read() or b"{}")
    except ValueError:
        status = {}
    return ApiError(
        err.code,
        str(status.get("reason") or err.reason),
        str(status.get("message") or err.reason),
        status.get("details"),
    )


class ApiStore:
    """`Store`'s kubelet-facing calls over HTTP (see the module docstring)."""

    def __init__(self, kubeconfig: str | Path) -> None:
        self.http = KubeHttp.from_kubeconfig(kubeconfig)
        self._watchers: dict[int, threading.Event] = {}
        self._streams: dict[int, HTTPResponse] = {}  # each watcher's open watch response

    # --- reads ---------------------------------------------------------------------------
    def get(self, resource: str, namespace: str, name: str) -> Obj:
        got: Obj = self.http.call("GET", _path(resource, namespace, name))
        return got

    def find(self, resource: str, namespace: str, name: str) -> Obj | None:
        try:
            return self.get(resource, namespace, name)
        except ApiError as err:
            if err.code == 404:
                return None
            raise

    def services_and_pods(self, namespace: str) -> tuple[list[Obj], list[Obj]]:
        """The Services and Pods of a namespace (for the pods' cluster DNS)."""
        services = self.http.call("GET", _path("services", namespace))
        pods = self.http.call("GET", _path("pods", namespace))
        return list(services.get("items") or []), list(pods.get("items") or [])

    # --- writes --------------------------------------------------------------------------
    def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        made: Obj = self.http.call("POST", _path(resource, namespace), obj)
        return made

    def update(self, resource: str, namespace: str, name: str, mutate: Callable[[Obj], Obj]) -> Obj:
        """Read, mutate a copy, write what changed; a 409 re-reads and mutates again."""
        for _ in range(MAX_CONFLICT_RETRIES):
            current = self.get(resource, namespace, name)
            new = mutate(copy.deepcopy(current))
            if new == current:
                return current
            try:
                return self._write(resource, namespace, name, current, new)
            except ApiError as err:
                if err.code != 409:
                    raise
        raise ApiError(409, "Conflict", f"{resource} {namespace}/{name}: too many conflicts")

    def _write(self, resource: str, namespace: str, name: str, current: Obj, new: Obj) -> Obj:
        if resource == "nodes":  # the kubelet writes a node's status only
            posted: Obj = self.http.call("PUT", _path("nodes", "", name) + "/status", new)
            return posted
        if resource != "pods":
            out: Obj = self.http.call("PUT", _path(resource, namespace, name), new)
            return out
        node = (new.get("spec") or {}).get("nodeName")
        if node and not (current.get("spec") or {}).get("nodeName"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "uid": current["metadata"]["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            self.http.call("POST", _path("pods", namespace, name) + "/binding", binding)
            current = self.get(resource, namespace, name)
        if new.get("status") == current.get("status"):
            return current
        body = copy.deepcopy(current)
        body["status"] = new.get("status") or {}
        written: Obj = self.http.call("PUT", _path("pods", namespace, name) + "/status", body)
        return written

    def remove(self, resource: str, namespace: str, name: str, *, uid: str | None = None) -> Obj:
        """DELETE at once (grace 0): what the kubelet does once a pod's containers stopped;
        `uid`: only that object (`preconditions.uid`, as the kubelet's status manager
        sends), never a successor of the same name."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        gone: Obj = self.http.call("DELETE", _path(resource, namespace, name), options)
        return gone

    # --- watch ---------------------------------------------------------------------------
    def watch(
        self,
        resource: str,
        namespace: str | None,
        accept: Callable[[Obj], bool],
        since: str | None,
    ) -> Watcher:
        """ADDED for what exists now, then every change (`since` is ignored: from now)."""
        w = Watcher(resource, namespace, accept)
        stop = threading.Event()
        self._watchers[id(w)] = stop
        ready = threading.Event()
        threading.Thread(
            target=self._watch_loop,
            args=(w, stop, ready),
            name=f"apistore-watch-{resource}",
            daemon=True,
        ).start()
        ready.wait(timeout=30)
        return w

    def unwatch(self, w: Watcher) -> None:
        stop = self._watchers.pop(id(w), None)
        if stop is not None:
            stop.set()
        _hang_up(self._streams.pop(id(w), None))
        w.close()

    def _watch_loop(self, w: Watcher, stop: threading.Event, ready: threading.Event) -> None:
        collection = _path(w.resource, w.namespace) if w.namespace else f"/api/v1/{w.resource}"
        known: dict[tuple[str, str], Obj] = {}
        rv = ""
        while not stop.is_set():
            try:
                if not rv:
                    rv = self._relist(w, collection, known)
                    ready.set()
                rv = self._watch_once(w, collection, rv, known, stop)
            except ApiError as err:
                if err.code == 410:
                    rv = ""  # too old: list again, and tell the kubelet what changed
                    continue
                log.warning("watch %s: %s; retrying", collection, err)
                stop.wait(0.5)
            except (OSError, ValueError) as err:
                if stop.is_set():
                    return
                log.debug("watch %s: %s; retrying", collection, err)
                stop.wait(0.2)

    def _relist(self, w: Watcher, collection: str, known: dict[tuple[str, str], Obj]) -> str:
        listed = self.http.call("GET", collection)
        now: dict[tuple[str, str], Obj] = {}
        for item in listed.get("items") or []:
            meta = item["metadata"]
            now[(meta.get("namespace", ""), meta["name"])] = item
        for key, old in known.items():
            if key not in now:
                self._deliver(w, "DELETED", old)
        for key, obj in sorted(now.items()):
            if key not in known:
                self._deliver(w, "ADDED", obj)
            elif known[key]["metadata"].get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                self._deliver(w, "MODIFIED", obj)
        known.clear()
        known.update(now)
        return str(listed["metadata"]["resourceVersion"])

    def _watch_once(
        self,
        w: Watcher,
        collection: str,
        rv: str,
        known: dict[tuple[str, str], Obj],
        stop: threading.Event,
    ) -> str:
        query = urllib.parse.urlencode(
            {
                "watch": "1",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(WATCH_TIMEOUT_S),
            }
        )
        with self.http.open("GET", f"{collection}?{query}", timeout=WATCH_TIMEOUT_S + 30) as resp:
            self._streams[id(w)] = resp
            if stop.is_set():  # unwatched while this connected: unwatch found no stream
                return rv
            for line in resp:
                if stop.is_set():
                    return rv
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("reason")), str(obj))
                rv = str(obj["metadata"].get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    continue
                meta = obj["metadata"]
                key = (meta.get("namespace", ""), meta["name"])
                if kind == "DELETED":
                    known.pop(key, None)
                else:
                    known[key] = obj
                self._deliver(w, kind, obj)
        return rv

    @staticmethod
    def _deliver(w: Watcher, kind: str, obj: Obj) -> None:
        if not w.closed and w.accept(obj):
            w.events.put((kind, obj))
