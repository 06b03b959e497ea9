"""The worker's workflow sandbox shares raysize's deterministic workflow modules instead of
re-importing them for every workflow run (a fifth of the worker's CPU at 1,000 resizes);
a module it does not share is re-imported and warned about on the worker's log."""

from __future__ import annotations

import pkgutil
from types import SimpleNamespace
from typing import Any, cast

from temporalio.client import Client
from temporalio.worker import Worker

import raysize.workflows
from raysize.activities.discovery import DiscoveryActivities
from raysize.activities.k8s import Kube
from raysize.worker.run import reconcile_input, use_client, workflow_runner
from raysize.worker.settings import Settings


def passed_through(name: str, passthrough: set[str]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:i]) in passthrough for i in range(1, len(parts) + 1))


def test_every_workflow_module_is_passed_through_by_its_installed_name() -> None:
    passthrough = set(workflow_runner().restrictions.passthrough_modules)
    modules = [
        m.name for m in pkgutil.iter_modules(raysize.workflows.__path__, "raysize.workflows.")
    ]
    assert "raysize.workflows.planner" in modules and len(modules) > 10
    assert [m for m in modules if not passed_through(m, passthrough)] == []
    # and nothing else of raysize: activities and the worker do I/O
    for other in ("raysize.activities.k8s", "raysize.worker.run", "raysize"):
        assert not passed_through(other, passthrough), other


def test_a_new_client_reaches_the_discovery_activities() -> None:
    """New TLS files make a new client (worker/temporal.py TemporalWatch): the worker takes
    it (`Worker.client`), and so must discovery, which starts reconcile workflows with its
    own reference."""
    old, new = cast(Client, object()), cast(Client, object())
    discovery = DiscoveryActivities(
        kube=cast(Kube, None), temporal=old, task_queue="q", start_input=reconcile_input(Settings())
    )
    worker: Any = SimpleNamespace(
        client=old, config=lambda: {"activities": [discovery.list_rayclusters, len]}
    )
    use_client(cast(Worker, worker), new)
    assert worker.client is new and discovery.temporal is new
