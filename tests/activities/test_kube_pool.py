"""The client keeps a pooled connection for each call the worker has in flight to the API
server (`RAYSIZE_KUBE_THREADS`): its own pool holds 5 per CPU, and a call beyond it opened
a connection, dropped it after, and logged a urllib3 WARNING each time."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from raysize.activities.k8s import WATCH_CONNECTIONS, Kube, fit_pool

CALLS = 24


class _SlowPods(BaseHTTPRequestHandler):
    """Answers every GET with an empty pod after 0.2 s, so the calls overlap."""

    protocol_version = "HTTP/1.1"  # keep-alive: connections go back to the pool

    def do_GET(self) -> None:
        time.sleep(0.2)
        body = json.dumps({"kind": "Pod", "metadata": {"name": "p"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowPods)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": host}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _pool_full_warnings(kube: Kube, caplog: pytest.LogCaptureFixture) -> int:
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"),
        ThreadPoolExecutor(CALLS) as pool,
    ):
        for _ in pool.map(lambda _: kube.get_pod("ns", "p"), range(CALLS)):
            pass
    return sum("Connection pool is full" in r.getMessage() for r in caplog.records)


def test_the_pool_holds_a_connection_for_each_call_in_flight(
    kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kube = Kube.from_kubeconfig(str(kubeconfig), connections=CALLS)
    assert kube.api.configuration.connection_pool_maxsize == CALLS + WATCH_CONNECTIONS
    assert _pool_full_warnings(kube, caplog) == 0


def test_without_it_the_clients_own_pool_drops_connections(
    kubeconfig: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `fit_pool` is for: the client's own size (here as on a 2-core machine)."""
    monkeypatch.setattr("multiprocessing.cpu_count", lambda: 2)
    kube = Kube.from_kubeconfig(str(kubeconfig))
    assert kube.api.configuration.connection_pool_maxsize == 10
    assert _pool_full_warnings(kube, caplog) > 0


def test_fit_pool_only_grows_the_pool() -> None:
    cfg = client.Configuration()
    cfg.connection_pool_maxsize = 50
    assert not fit_pool(cfg, 8)  # 8 calls and the watches fit already
    assert cfg.connection_pool_maxsize == 50
    assert not fit_pool(cfg, 0)  # 0: the client's own size
    assert fit_pool(cfg, 64)
    assert cfg.connection_pool_maxsize == 64 + WATCH_CONNECTIONS
