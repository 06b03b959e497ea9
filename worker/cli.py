"""The `raysize` command. Each command family lives in its own module and is mounted here."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback

import typer

from raysize.worker.cli_common import run_before_exit

app = typer.Typer(
    name="raysize",
    help=(
        "Resize the pods of Ray clusters on Kubernetes in place, and scale them out and in, "
        "driven by the resource demands Ray reports - as durable Temporal workflows."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """raysize: in-place resize and scale-out of Ray clusters on Kubernetes."""


def _mount() -> None:
    """Operations first (they are what `raysize --help` shows first), then the tools. The
    tools load their stand-ins (sandbox, demo, Ray) only when they run."""
    from raysize.worker import cli_demo, cli_doctor, cli_ops, cli_plan, cli_ray, cli_sandbox

    for family in (cli_ops, cli_doctor, cli_plan, cli_sandbox, cli_demo, cli_ray):
        family.register(app)


_mount()


def main() -> None:
    """Run the command, then leave without the interpreter's teardown.

    The Temporal client's Rust runtime keeps threads that may call into Python while the
    interpreter finalizes; then a command that did its work and printed its output died
    with `Fatal Python error: PyGILState_Release` (134) or a segmentation fault (139),
    a few times in a hundred (temporalio/sdk-python#300). Everything a command must do
    ends before it returns (its `finally` blocks, telemetry flushed), so the exit code
    is taken, the output flushed, and the process leaves at once with that code."""
    os._exit(_run_app())


def _run_app() -> int:
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # what the interpreter would print on the way out
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit 1
        print(code, file=sys.stderr)
        code = 1
    run_before_exit()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to say
            stream.flush()
    return code


if __name__ == "__main__":
    main()
