"""The embedded API server's watch ends as the watch cache's does (sandbox/server.py): the
events already queued for the watch go out before the bookmark that says how far it got.

It sent the bookmark at the store's newest revision at once: a watch that ended with
events still queued for it (a busy server, or a stream not read for a moment) had its
client resume after them, and the client's cache missed them for good. A 1,000-cluster
churn run kept three deleted pods in the worker's pod cache, which said it was synced; the
worker's watch ends every 30 s since #43, so it happened ten times as often."""

from __future__ import annotations

import json
import time

from raysize.sandbox.server import Api


def test_events_queued_when_a_watch_ends_go_before_its_bookmark() -> None:
    api = Api()
    start = api.store.resource_version
    watch = api.handle(
        "GET",
        f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}"
        "&timeoutSeconds=1&allowWatchBookmarks=true",
        {},
        b"",
    )
    assert watch.code == 200 and watch.stream is not None
    for i in range(3):  # queued for the watch while nobody reads it
        api.internal(
            "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": f"cm-{i}"}}
        )
    time.sleep(1.2)  # the watch's time is up before its stream is read
    lines = [json.loads(line) for line in watch.stream]
    kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in lines]
    assert kinds == [
        ("ADDED", "cm-0"),
        ("ADDED", "cm-1"),
        ("ADDED", "cm-2"),
        ("BOOKMARK", None),
    ], kinds
    # the bookmark is where a resumed watch starts: after the last event, not before it
    last = int(lines[2]["object"]["metadata"]["resourceVersion"])
    assert int(lines[3]["object"]["metadata"]["resourceVersion"]) >= last
