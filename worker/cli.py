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
    from worker import cli_plan

    cli_plan.register(app)
    from worker import cli_ray

    cli_ray.register(app)
    from worker import cli_sandbox

    cli_sandbox.register(app)
    from worker import cli_ops

    cli_ops.register(app)
    from worker import cli_demo

    cli_demo.register(app)


_mount()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
