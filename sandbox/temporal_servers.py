"""The Temporal SDK's own servers (`WorkflowEnvironment.start_local`, the CLI dev server;
`start_time_skipping`, the time-skipping test server), guarded by the reaper.

The SDK's core starts the server as a child of this process, in this process's group,
and stops it at `env.shutdown()`. A test run or a benchmark killed by SIGKILL (CI's
timeout, the OOM killer) never shuts it down: the server ran on, holding its port and
memory. The core tells nobody the server's PID either. So the core is handed, as the
server's binary, a small script that puts itself in a session (and group) of its own,
writes its PID down and becomes the server (`exec`: the same PID); that group is then
`reaper.guard_group`ed like every group the sandbox starts. The core still stops the
server by its PID at shutdown, as before.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from raysize.sandbox import reaper

_WRAPPER = """#!{python} -I
import os, sys
os.setsid()  # a session, and a process group, of its own: the reaper stops that group
with open({pid_file!r}, "w") as f:
    f.write(str(os.getpid()))
os.execv({binary!r}, [{binary!r}, *sys.argv[1:]])
"""


@contextlib.contextmanager
def _in_own_session(binary: str) -> Iterator[tuple[str, Path]]:
    """A script that runs `binary` (its arguments passed on) in a session of its own, and
    the file it writes its PID to; both removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="raysize-temporal-"))
    try:
        script, pid_file = folder / "server", folder / "pid"
        script.write_text(
            _WRAPPER.format(python=sys.executable, pid_file=str(pid_file), binary=binary)
        )
        script.chmod(0o700)
        yield str(script), pid_file
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _guard(pid_file: Path) -> int:
    pid = int(pid_file.read_text())
    reaper.guard_group(pid)
    return pid


async def start_local(*, dev_server_existing_path: str, **kw: Any) -> WorkflowEnvironment:
    """`WorkflowEnvironment.start_local` with the dev server at `dev_server_existing_path`,
    its process group guarded by the reaper (`kw`: the SDK's other arguments)."""
    with _in_own_session(dev_server_existing_path) as (script, pid_file):
        env = await WorkflowEnvironment.start_local(dev_server_existing_path=script, **kw)
        _guard(pid_file)
    return env


async def start_time_skipping(*, test_server_existing_path: str, **kw: Any) -> WorkflowEnvironment:
    """`WorkflowEnvironment.start_time_skipping` with the test server at
    `test_server_existing_path`, its process group guarded by the reaper."""
    with _in_own_session(test_server_existing_path) as (script, pid_file):
        env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=script, **kw)
        _guard(pid_file)
    return env
