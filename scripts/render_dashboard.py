"""Render the Grafana dashboard of deploy/components/monitoring to a PNG, without Grafana.

Each panel is drawn where its gridPos puts it (Grafana's grid: 24 columns), with its
title, unit, legend and draw style, over six hours of sample data: a simulated raysize
whose resizes mostly succeed, with two incidents a person should spot. From 2 h 40 to
2 h ago a full node makes grows of cluster "serve" infeasible (rollbacks, Raylet sync
retries, slow demand → resize); from 4 h 40 to 4 h 20 ago Ray's GCS restarts and
observe fails. Outcome label values come from raysize's code; the rest are typical.
It shows how the dashboard reads, not real numbers.

    pip install -e '.[dashboard]'
    python scripts/render_dashboard.py --out /tmp/raysize-dashboard.png
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "components" / "monitoring" / "raysize-dashboard.json"
GRID_COLUMNS = 24
POINTS = 72  # six hours at 5-minute steps
NODE_FULL = range(40, 48)  # 2 h 40 → 2 h ago
GCS_RESTART = range(16, 20)  # 4 h 40 → 4 h 20 ago
CLUSTERS = ("train", "serve")
ROLLBACK_REASONS = {"timeout": 0.4, "kubelet_error": 0.2, "infeasible": 0.2, "canceled": 0.2}
FAILURE_REASONS = ("pod_gone", "raylet_gone", "activity_error")

# (metric, legend) → one value per step
Samples = dict[tuple[str, str], list[float]]


def outcomes() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from raysize.workflows.contracts import ResizeOutcome

    # every outcome a saga records (Pending is a state, not an outcome)
    return [o.value for o in ResizeOutcome if o is not ResizeOutcome.PENDING]


def simulate(rng: random.Random) -> Samples:
    """Counts per 5-minute step and latency quantiles, keyed the way panels ask for them."""
    out: Samples = defaultdict(lambda: [0.0] * POINTS)
    names = outcomes()
    normal = {"Succeeded": 0.9, "RolledBack": 0.05, "Canceled": 0.01, "PodGone": 0.03}
    for t in range(POINTS):
        full = t in NODE_FULL
        for cluster in CLUSTERS:
            started = sum(rng.random() < 0.5 for _ in range(6 if cluster == "train" else 4))
            out[("raysize_resizes_started", "started")][t] += started
            for _ in range(started):
                odds = (
                    {"Succeeded": 0.3, "RolledBack": 0.7} if full and cluster == "serve" else normal
                )
                pick = rng.choices([*odds, "RayletGone"], [*odds.values(), 0.01])[0]
                pick = pick if pick in names else "Succeeded"
                out[("raysize_resize_duration_seconds", pick)][t] += 1
                if pick == "RolledBack":
                    weights = {"infeasible": 0.7, "timeout": 0.3} if full else ROLLBACK_REASONS
                    reason = rng.choices(list(weights), list(weights.values()))[0]
                    out[("raysize_resizes_rolled_back", reason)][t] += 1
            retries = (
                3 + rng.randrange(4) if full and cluster == "serve" else int(rng.random() < 0.03)
            )
            out[("raysize_raylet_sync_retries", f"team-a/{cluster}")][t] += retries
        if rng.random() < 0.02:
            out[("raysize_resizes_failed", f"failed: {rng.choice(FAILURE_REASONS)}")][t] += 1
        out[("temporal_local_activity_execution_failed", "raysize")][t] = (
            6 + rng.randrange(4) if t in GCS_RESTART else 0
        )
        slow = 6.0 if full else 1.0
        p50 = 3.0 * rng.lognormvariate(0, 0.15)
        out[("raysize_demand_to_resize_seconds", "p50")][t] = p50 * (2 if full else 1)
        out[("raysize_demand_to_resize_seconds", "p95")][t] = p50 * 2.5 * slow
        plan = 0.002 * rng.lognormvariate(0, 0.1)
        out[("raysize_plan_duration_seconds", "p50")][t] = plan
        out[("raysize_plan_duration_seconds", "p99")][t] = plan * 4 * rng.lognormvariate(0, 0.2)
        typical = {"Succeeded": 4.0, "RolledBack": 60.0, "Canceled": 20.0, "PodGone": 8.0}
        for name in names:
            base = typical.get(name, 10.0) * rng.lognormvariate(0, 0.1)
            out[("raysize_resize_duration_seconds", f"p95 {name}")][t] = base
    return out


def metric_of(expr: str) -> str:
    found = re.search(r"\b((?:raysize|temporal)_\w+?)(?:_bucket|_count|_sum)?\b[{\[]", expr)
    if found is None:
        raise ValueError(f"no raysize or temporal metric in {expr!r}")
    return found.group(1)


def panel_series(panel: dict[str, Any], samples: Samples) -> list[tuple[str, list[float]]]:
    """The legend entries a panel would show over the samples, with their values."""
    out: list[tuple[str, list[float]]] = []
    for target in panel["targets"]:
        metric = metric_of(target["expr"])
        fmt = target.get("legendFormat", "")
        quantile = "histogram_quantile" in target["expr"]
        for (m, legend), values in sorted(samples.items()):
            if m != metric or legend.startswith("p95 ") != (quantile and "{{" in fmt):
                continue
            shown = legend.removeprefix("p95 ")
            if "{{" not in fmt and shown != fmt:
                continue  # a fixed legend (p50, started) names one series
            out.append((shown, values))
    if not out:
        raise ValueError(f"panel {panel['title']!r}: no sample data")
    return out


def render(dashboard: dict[str, Any], out: Path, seed: int = 7) -> int:
    """Draw every panel; returns how many were drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    samples = simulate(random.Random(seed))
    panels = [p for p in dashboard["panels"] if p.get("type") == "timeseries"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    row_in, header_in, width_in = 0.42, 0.5, 16.0  # a grid row, the title line, the page
    height_in = header_in + rows * row_in
    fig = plt.figure(figsize=(width_in, height_in), dpi=100)
    fig.text(
        0.005,
        1 - 0.25 / height_in,
        f"{dashboard['title']}: sample data, namespace team-a, clusters {', '.join(CLUSTERS)}; "
        "node full 2h40-2h ago (serve), GCS restart 4h40-4h20 ago",
        fontsize=13,
        va="center",
    )

    def box(pos: dict[str, int]) -> tuple[float, float, float, float]:
        """The panel's axes in figure coordinates, inside its grid cell: room on the left
        for y labels, above for the title and below for the time axis."""
        left = pos["x"] / GRID_COLUMNS + 0.6 / width_in
        right = (pos["x"] + pos["w"]) / GRID_COLUMNS - 0.15 / width_in
        top = 1 - (header_in + pos["y"] * row_in + 0.35) / height_in
        bottom = 1 - (header_in + (pos["y"] + pos["h"]) * row_in - 0.3) / height_in
        return left, bottom, right - left, top - bottom

    hours = [i * 6 / POINTS for i in range(POINTS)]
    for panel in panels:
        pos = panel["gridPos"]
        ax = fig.add_axes(box(pos))
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        unit = defaults.get("unit", "short")
        custom = defaults.get("custom", {})
        bars = custom.get("drawStyle") == "bars"
        stacked = custom.get("stacking", {}).get("mode") == "normal"
        drawn = panel_series(panel, samples)
        bottom = [0.0] * POINTS
        for name, ys in drawn:
            if bars:
                ax.bar(
                    hours,
                    ys,
                    width=6 / POINTS * 0.9,
                    bottom=bottom if stacked else None,
                    label=name,
                )
                if stacked:
                    bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
            else:
                ax.plot(hours, ys, linewidth=1.2, label=name)
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + (high - low) * 0.2)  # headroom for the legend
        ax.set_title(panel["title"], fontsize=11, loc="left")
        ax.set_xlim(0, 6)
        ax.set_xticks(range(7), [f"-{6 - h}h" if h < 6 else "now" for h in range(7)], fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        if unit == "s":
            ax.yaxis.set_major_formatter(EngFormatter(unit="s"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=min(len(drawn), 6), frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return len(panels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--out", type=Path, default=Path("raysize-dashboard.png"))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    drawn = render(json.loads(args.dashboard.read_text()), args.out, args.seed)
    print(f"{args.out}: {drawn} panels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
