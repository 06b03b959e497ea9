"""Screenshots of the Temporal UI of a running `raysize demo`, and what its pages say.

A manual check (issue #15): does the UI show the resize workflows' user metadata? It
takes headless Chromium screenshots of the workflow list and of the newest resize
workflow's page, and reports whether each page's rendered DOM holds that workflow's
static summary (read back with `temporal workflow describe`). Look at the PNGs too.

Needs Debian's chromium (`apt-get install chromium`; not installed by `make`, so this is
not a CI test) and a demo that stays up:

    raysize demo --scenario grow --stay --temporal-port 7233 --ui-port 8233 &
    python scripts/ui_screenshots.py --ui-port 8233 --temporal-port 7233 --out /tmp/ui
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

# as root in a closed network: no sandbox, no background traffic, a fresh profile
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=8000",  # let the single-page app fetch and render
]


def chromium(profile: Path, *args: str) -> str:
    binary = shutil.which("chromium")
    if binary is None:
        sys.exit("chromium not found: apt-get install chromium")
    out = subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def newest_resize(temporal: str, address: str) -> dict[str, str]:
    listed = subprocess.run(
        [temporal, "workflow", "list", "--address", address, "-o", "json", "--limit", "1",
         "--query", "WorkflowType='PodResizeWorkflow'"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (wf,) = json.loads(listed)
    wid, run = wf["execution"]["workflowId"], wf["execution"]["runId"]
    described = subprocess.run(
        [temporal, "workflow", "describe", "--address", address, "-o", "json", "-w", wid,
         "-r", run],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    meta = json.loads(described)["executionConfig"].get("userMetadata") or {}
    return {"id": wid, "run": run, "summary": meta.get("summary", "")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ui-port", type=int, default=8233)
    ap.add_argument("--temporal-port", type=int, default=7233)
    ap.add_argument("--out", type=Path, default=Path("/tmp/raysize-ui"))
    ap.add_argument("--window-size", default="1400,900")
    args = ap.parse_args()
    temporal = shutil.which("temporal") or str(Path(sys.executable).with_name("temporal"))
    args.out.mkdir(parents=True, exist_ok=True)
    resize = newest_resize(temporal, f"127.0.0.1:{args.temporal_port}")
    base = f"http://localhost:{args.ui_port}/namespaces/default/workflows"
    pages = {
        "list": base,
        "resize": f"{base}/{quote(resize['id'], safe='')}/{resize['run']}/history",
    }
    print(f"newest resize: {resize['id']} (run {resize['run']})")
    print(f"its static summary (temporal workflow describe): {resize['summary']!r}")
    with tempfile.TemporaryDirectory(prefix="raysize-chromium-") as profile:
        for name, url in pages.items():
            png = args.out / f"{name}.png"
            chromium(Path(profile), f"--screenshot={png}", f"--window-size={args.window_size}", url)
            dom = chromium(Path(profile), "--dump-dom", url)
            shown = bool(resize["summary"]) and resize["summary"] in dom
            print(f"{name}: {png}  summary in the page: {'yes' if shown else 'NO'}  ({url})")


if __name__ == "__main__":
    main()
