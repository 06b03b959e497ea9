"""The `raysize` command. Each command family lives in its own module and is mounted here."""

from __future__ import annotations

import typer

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
    from worker import cli_demo, cli_ops, cli_plan, cli_ray, cli_sandbox

    for family in (cli_ops, cli_plan, cli_sandbox, cli_demo, cli_ray):
        family.register(app)


_mount()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
