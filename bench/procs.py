"""What the benchmarks start: a `raysize worker` process of this checkout, in a session
of its own (so it is stopped by its process group: `sandbox.localray.stop_group`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_raysize_worker(
    log_path: Path, temporal: str, queue: str, kubeconfig: Path, **settings: str
) -> subprocess.Popen[bytes]:
    """`raysize worker` against `temporal`, polling `queue`, with `settings` as
    RAYSIZE_<NAME> variables (none of this shell's RAYSIZE_* leak in); its output is
    appended to `log_path`."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAYSIZE_")},
        "PYTHONPATH": str(ROOT),
        "RAYSIZE_TEMPORAL_ADDRESS": temporal,
        "RAYSIZE_TASK_QUEUE": queue,
        "RAYSIZE_KUBECONFIG": str(kubeconfig),
        **{f"RAYSIZE_{name.upper()}": value for name, value in settings.items()},
    }
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
