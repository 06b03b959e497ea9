"""What the `raysize` command's families share: how `--help` groups the commands."""

from __future__ import annotations

# `raysize --help` shows what runs a cluster first, the tools for trying it apart
OPS_PANEL = "Operations"
DEV_PANEL = "Development tools (not needed to run raysize)"
