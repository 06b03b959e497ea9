"""Write a kubeconfig that points `kubectl` and the `kubernetes` client at a test world:
the embedded sandbox (plain HTTP, any token) or the real kube-apiserver (HTTPS with its
own certificate as the CA, a bearer token)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

CONTEXT = "raysize-sandbox"


def kubeconfig(
    server_url: str,
    namespace: str = "default",
    *,
    token: str = "sandbox",
    ca_pem: bytes | None = None,
    name: str = CONTEXT,
) -> dict[str, object]:
    cluster: dict[str, str] = {"server": server_url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
        ],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | os.PathLike[str],
    server_url: str,
    namespace: str = "default",
    *,
    token: str = "sandbox",
    ca_pem: bytes | None = None,
    name: str = CONTEXT,
) -> Path:
    """Write the kubeconfig (JSON is valid YAML) readable only by its owner, atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    doc = kubeconfig(server_url, namespace, token=token, ca_pem=ca_pem, name=name)
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(target)
    return target
