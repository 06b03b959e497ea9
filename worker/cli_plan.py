"""`raysize plan`: run the planner on a scenario file (filled in by the planner commit)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd() -> None:
        """Plan one reconcile tick from a scenario file."""
        raise typer.Exit(code=2)
