"""Headless Chromium (Debian's, installed by `make browser`) driven over the DevTools
protocol on a pipe: no port, no websocket, no driver.

Chromium reads the protocol's JSON messages from its fd 3 and writes its own to fd 4,
each ended by a NUL byte (`--remote-debugging-pipe`). One page is attached in flattened
mode, so every page command carries its session id.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

# as root in a closed network (the env notes): no sandbox, no background traffic
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]


PAGE_TEXT = """
[document, ...[...document.querySelectorAll('iframe')].map(f => f.contentDocument)]
  .map(d => (d && d.body) ? d.body.innerText : '').join('\\n')
"""


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page; stopped by its process group on exit."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        binary = shutil.which("chromium")
        if binary is None:
            raise BrowserError("chromium not found: `make browser` installs Debian's chromium")
        self.profile = tempfile.TemporaryDirectory(prefix="raysize-chromium-")
        to_child, self._write = os.pipe()  # we write commands, Chromium reads them on fd 3
        self._read, from_child = os.pipe()  # Chromium writes answers on fd 4

        def pipes_at_3_and_4() -> None:
            # via fds above both targets, so neither dup2 overwrites the other's source;
            # Python's own fds are not inheritable (PEP 446), so only 3 and 4 reach Chromium
            high_in, high_out = os.dup2(to_child, 1000), os.dup2(from_child, 1001)
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)
            os.close(high_in)
            os.close(high_out)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile.name}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipes_at_3_and_4,
            close_fds=False,
            start_new_session=True,
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next_id = 0
        self.session = ""
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            self.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    # --- the protocol ------------------------------------------------------------------
    def call(self, method: str, timeout_s: float = 30, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self._message(deadline, method)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result

    def _message(self, deadline: float, method: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError(f"{method}: no answer from Chromium")
            os.set_blocking(self._read, False)
            try:
                chunk = os.read(self._read, 1 << 20)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if not chunk:
                raise BrowserError(f"{method}: Chromium exited (code {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    # --- what the tests use --------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        """The page's visible text, then that of its same-origin frames (the Temporal UI
        renders user metadata's markdown in frames of its own)."""
        return str(self.evaluate(PAGE_TEXT) or "")

    def wait_for_text(self, *needles: str, timeout_s: float = 60) -> str:
        """The page's visible text once it holds every needle (a single-page app fetches
        and renders after the load); on timeout, the error shows what it did hold."""
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.25)
        missing = [n for n in needles if n not in text]
        raise BrowserError(f"the page never showed {missing}; it showed:\n{text[:3000]}")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """Stop Chromium and its helpers (its zygote and renderers share its group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever outlived the TERM
        self.proc.wait(timeout=10)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
