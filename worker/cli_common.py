"""What the `raysize` command's families share: how `--help` groups the commands, how a
tool command refuses its options, and what it says when its stand-ins are not installed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

# `raysize --help` shows what runs a cluster first, the tools for trying it apart
OPS_PANEL = "Operations"
DEV_PANEL = "Development tools (not needed to run raysize)"

# what the worker image leaves out (deploy/Dockerfile.dockerignore): the tools need them
STAND_IN_MODULES = ("raysize.sandbox", "raysize.worker.demo")


# run by `raysize`'s main once the command has returned, before it leaves with os._exit
# (which skips atexit): e.g. the sandbox's process reaper, waited for so that nothing the
# command started outlives it
_BEFORE_EXIT: list[Callable[[], None]] = []


def before_exit(fn: Callable[[], None]) -> None:
    """Call fn once the command has returned, before the process exits (newest first)."""
    _BEFORE_EXIT.append(fn)


def run_before_exit() -> None:
    while _BEFORE_EXIT:
        fn = _BEFORE_EXIT.pop()
        with contextlib.suppress(Exception):
            fn()


def usage_error(message: str) -> typer.Exit:
    """`error: …` on stderr; raise the result (exit 2: the command was asked wrongly)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@contextmanager
def stand_ins(command: str) -> Iterator[None]:
    """Around a tool command's imports of the sandbox or the demo: where they are not
    installed (the worker image carries the worker only), say so in one line, exit 2."""
    try:
        yield
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith(STAND_IN_MODULES):
            raise
        raise usage_error(
            f"`raysize {command}` needs {err.name}, which this installation leaves out "
            "(the worker image carries only the worker): run it from a source checkout "
            "(make install) or a full install (pip install 'raysize[demo]')"
        ) from None
