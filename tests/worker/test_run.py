"""The worker's process: how it runs workflows (outside Temporal's sandbox), and the
clients its activities use."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import raysize.workflows
from raysize.activities.discovery import DiscoveryActivities
from raysize.activities.k8s import Kube
from raysize.worker.run import reconcile_input, use_client, workflow_runner
from raysize.worker.settings import Settings


def test_workflows_run_outside_the_sandbox() -> None:
    """The sandbox checked none of raysize's workflow code (it was passed through) and
    ran code through `exec` for every activation and payload on the worker's event loop
    (docs/design/temporal-notes.md); the replay test runs the same runner."""
    assert isinstance(workflow_runner(), UnsandboxedWorkflowRunner)


# builtins that do I/O or run code: the sandbox refused `open` and `input` during an
# activation; the import contracts (pyproject.toml) keep the modules that differ from run
# to run (time, random, os, ...) out of the workflow package
FORBIDDEN_BUILTINS = {"open", "input", "print", "exec", "eval", "breakpoint", "__import__"}


def test_workflow_code_calls_no_builtin_that_does_io() -> None:
    root = Path(raysize.workflows.__file__).resolve().parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10
    calls = [
        f"{f.relative_to(root)}:{node.lineno} {node.func.id}()"
        for f in files
        for node in ast.walk(ast.parse(f.read_text(), str(f)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in FORBIDDEN_BUILTINS
    ]
    assert calls == []


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
