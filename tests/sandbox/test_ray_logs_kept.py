"""A failed demo keeps every pod's Ray logs: the sandbox's Ray temp dir is removed when it
stops, and a kept directory without them explained nothing (issue #11, item 7)."""

from __future__ import annotations

import socket
from pathlib import Path

from raysize.sandbox.rayprocs import RayRuntime


def test_keep_logs_copies_the_logs_and_skips_sockets_and_links(tmp_path: Path) -> None:
    runtime = RayRuntime(temp_root=str(tmp_path))
    try:
        root = runtime.root
        (root / "demo-small-worker-abcde.log").write_text("ray start output\n")
        logs = root / "n1" / "session_2026" / "logs"
        logs.mkdir(parents=True)
        (logs / "raylet.out").write_text("raylet says\n")
        (logs / "gcs_server.err").write_text("gcs says\n")
        (logs / "data.bin").write_bytes(b"\\0" * 10)
        (root / "n1" / "session_latest").symlink_to(root / "n1" / "session_2026")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(root / "n1" / "raylet.sock"))
        dest = tmp_path / "kept"
        assert runtime.keep_logs(dest) == 3
        assert (dest / "demo-small-worker-abcde.log").read_text() == "ray start output\n"
        assert (dest / "n1" / "session_2026" / "logs" / "raylet.out").read_text() == "raylet says\n"
        assert (dest / "n1" / "session_2026" / "logs" / "gcs_server.err").exists()
        assert not (dest / "n1" / "session_latest").exists()
        sock.close()
    finally:
        runtime.close()
