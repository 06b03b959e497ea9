"""The kubelet simulator's watch over HTTP (sandbox/apistore.py) ends when it is told to.

A watch left open after its watcher stopped kept kube-apiserver from exiting on SIGTERM
(it waits for open requests): every real world took the 10 s grace to stop, then a
SIGKILL. Unwatching now hangs up the connection, so the watch's thread ends at once, with
no event needed to wake it."""

from __future__ import annotations

import threading

from raysize.sandbox.apistore import ApiStore


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "apistore-watch-pods"]


def test_unwatch_hangs_up_the_watch_at_once(kubeconfig: str) -> None:
    before = set(_watch_threads())
    store = ApiStore(kubeconfig)
    w = store.watch("pods", "kube-system", lambda o: True, None)
    (thread,) = set(_watch_threads()) - before
    store.unwatch(w)
    # nothing happens in kube-system meanwhile: only the hang-up can end the read
    thread.join(timeout=5)
    assert not thread.is_alive(), "the watch still holds its connection to the API server"
