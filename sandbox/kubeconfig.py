"""Write a kubeconfig that points `kubectl` and the `kubernetes` client at the sandbox."""

from __future__ import annotations

import json
import os
from pathlib import Path

CONTEXT = "raysize-sandbox"


def kubeconfig(server_url: str, namespace: str = "default") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {"token": "sandbox"}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: str | os.PathLike[str], server_url: str) -> Path:
    """Write the kubeconfig (JSON is valid YAML) readable only by its owner."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(kubeconfig(server_url), indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(target)
    return target
