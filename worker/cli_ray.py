"""`raysize ray status|resize`: look at and resize a Ray cluster through its GCS.

Errors are one line on stderr: exit code 2 for bad input (refused before anything is
sent), 1 when Ray refuses or cannot be reached.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from raysize.activities.ray_gcs import (
    DEFAULT_TIMEOUT_S,
    TLS_SERVER_NAME_ENV,
    RayError,
    RayGcsClient,
    RayInvalidArgument,
    TlsConfig,
    resize_request,
)
from raysize.activities.ray_state import ClusterState, LabelSelector, RayNode
from raysize.worker.cli_common import DEV_PANEL
from raysize.workflows.resources import (
    CPU,
    MEMORY,
    QuantityError,
    Resources,
    quantity_to_units,
    units_to_float,
)

ray_app = typer.Typer(
    name="ray",
    help="Look at a Ray cluster's nodes and demands, and resize Raylets, via the GCS.",
    no_args_is_help=True,
)

GcsOption = Annotated[
    str,
    typer.Option("--gcs", help="The GCS address HOST:PORT (the head's --port, 6379 by default)."),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help="File holding the Ray auth token; default: $RAY_AUTH_TOKEN, or the file named by "
        "$RAY_AUTH_TOKEN_PATH.",
        show_default=False,
    ),
]
# A token on the command line is in every `ps` listing and in shell history: the flag is
# kept only to say what to use instead.
TokenOption = Annotated[str | None, typer.Option("--token", hidden=True, show_default=False)]
TOKEN_ON_COMMAND_LINE = (
    "--token puts the token on the command line, where ps and shell history show it: use "
    "--token-file PATH, or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) in the environment"
)
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0.001, help="Deadline of each call, in seconds.")
]
CaOption = Annotated[
    Path | None, typer.Option("--tls-ca", help="CA certificate (mutual TLS).", show_default=False)
]
CertOption = Annotated[
    Path | None,
    typer.Option("--tls-cert", help="Client certificate (mutual TLS).", show_default=False),
]
KeyOption = Annotated[
    Path | None, typer.Option("--tls-key", help="Client key (mutual TLS).", show_default=False)
]
ServerNameOption = Annotated[
    str | None,
    typer.Option(
        "--tls-server-name",
        help="Name to check the GCS certificate against, when the address dialled (an IP, "
        f"a port-forward) is not in it; default: ${TLS_SERVER_NAME_ENV}.",
        show_default=False,
    ),
]


def _fail(message: str, code: int) -> NoReturn:
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code=code)


def read_token_file(path: Path | None) -> str | None:
    """The token in `--token-file`, stripped; RayInvalidArgument if it cannot be read or
    is empty. None without the flag (then the environment is used)."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise RayInvalidArgument(
            f"--token-file {path}: {exc.strerror or exc} (give the file holding the token)"
        ) from None
    except UnicodeDecodeError:
        raise RayInvalidArgument(f"--token-file {path}: not a text file") from None
    if not token:
        raise RayInvalidArgument(f"--token-file {path} is empty")
    return token


def _client(
    gcs: str,
    token: str | None,
    timeout: float,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    server_name: str | None,
) -> RayGcsClient:
    """The client, from the flags, else Ray's TLS settings in the environment.

    Only builds: nothing is sent until the first call."""
    tls: TlsConfig | None
    if ca or cert or key:
        if not (ca and cert and key):
            raise RayInvalidArgument("mutual TLS needs all of --tls-ca, --tls-cert and --tls-key")
        tls = TlsConfig(
            ca_cert=ca,
            cert=cert,
            key=key,
            server_name=server_name or os.environ.get(TLS_SERVER_NAME_ENV) or None,
        )
    else:
        tls = TlsConfig.from_env()
        if server_name:
            if tls is None:
                raise RayInvalidArgument(
                    "--tls-server-name needs TLS: --tls-ca, --tls-cert and --tls-key, "
                    "or RAY_USE_TLS=1 with Ray's TLS settings"
                )
            tls = dataclasses.replace(tls, server_name=server_name)
    return RayGcsClient(gcs, token=token, tls=tls, timeout=timeout)


def _cpu(r: Resources) -> str:
    return f"{units_to_float(r.cpu, CPU):g}"


def _memory(r: Resources) -> str:
    """Bytes as the shortest exact quantity ("2Gi", "1G"), else approximately."""
    amount = r.memory
    if amount <= 0:
        return str(amount)
    for suffix, factor in (("Gi", 2**30), ("G", 10**9), ("Mi", 2**20), ("M", 10**6)):
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return f"~{amount / 2**30:.2f}Gi"


def _shape(r: Resources) -> str:
    # Placement-group bookkeeping resources (CPU_group_…) say nothing to an operator.
    return Resources({n: v for n, v in r.items() if "_group_" not in n}).describe()


def _selectors(selectors: tuple[LabelSelector, ...]) -> str:
    return " | ".join(s.describe() for s in selectors) or "-"


def _node_row(n: RayNode) -> list[str]:
    return [
        n.pod or "-",
        n.group or "-",
        n.node_id[:12],
        n.status.value,
        f"{_cpu(n.available)}/{_cpu(n.total)}",
        f"{_memory(n.available)}/{_memory(n.total)}",
        f"{n.idle_ms / 1000:.0f}s" if n.idle_ms else "-",
    ]


def _table(title: str) -> Table:
    # At least as wide as its title: rich would wrap a title wider than the columns.
    return Table(title=title, title_justify="left", min_width=len(title))


def print_status(state: ClusterState, console: Console) -> None:
    nodes = _table(f"Ray nodes ({state.session_name})")
    for column in ("pod", "group", "node id", "status", "CPU free/total", "memory free/total"):
        nodes.add_column(column, no_wrap=True)
    nodes.add_column("idle", justify="right")
    for n in sorted(state.nodes, key=lambda n: (not n.alive, n.group, n.pod)):
        nodes.add_row(*_node_row(n))
    console.print(nodes)

    if state.demands:
        demands = _table("Pending tasks and actors")
        for column in ("shape", "count", "label selector"):
            demands.add_column(column)
        for d in state.demands:
            demands.add_row(_shape(d.shape), str(d.count), _selectors(d.label_selectors))
        console.print(demands)
    else:
        console.print("Pending tasks and actors: none")

    if state.gangs:
        gangs = _table("Pending placement groups")
        for column in ("placement group", "strategy", "state", "bundles"):
            gangs.add_column(column)
        for g in state.gangs:
            bundles = ", ".join(_shape(b.shape) for b in g.bundles)
            gangs.add_row(g.placement_group_id, g.strategy.value, g.state, bundles)
        console.print(gangs)
    else:
        console.print("Pending placement groups: none")

    if state.constraints:
        constraints = _table("request_resources() constraints")
        for column in ("shape", "count"):
            constraints.add_column(column)
        for c in state.constraints:
            constraints.add_row(_shape(c.shape), str(c.count))
        console.print(constraints)
    else:
        console.print("request_resources() constraints: none")


def resolve_node(state: ClusterState, *, node: str | None, pod: str | None) -> RayNode:
    """The live node named by --pod, or by --node (full id or a unique prefix)."""
    if pod is not None:
        found = state.node_for_pod(pod)
        if found is None:
            pods = ", ".join(sorted({n.pod for n in state.alive_nodes if n.pod})) or "none"
            raise LookupError(f"no Ray node for pod {pod!r} (live pods: {pods})")
    else:
        assert node is not None
        wanted = node.lower()
        matches = [n for n in state.nodes if n.node_id.startswith(wanted)]
        if not matches:
            raise LookupError(f"no Ray node with id {node!r}")
        alive = [n for n in matches if n.alive]
        if len(alive) > 1:
            raise LookupError(f"node id prefix {node!r} matches {len(alive)} nodes")
        found = (alive or matches)[0]
    if not found.alive:
        raise LookupError(f"the Raylet of {found.pod or found.node_id} is dead")
    return found


def register(app: typer.Typer) -> None:
    app.add_typer(ray_app, rich_help_panel=DEV_PANEL)


@ray_app.command("status")
def status_cmd(
    gcs: GcsOption,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the cluster state as JSON.")
    ] = False,
    token_file: TokenFileOption = None,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    tls_ca: CaOption = None,
    tls_cert: CertOption = None,
    tls_key: KeyOption = None,
    tls_server_name: ServerNameOption = None,
) -> None:
    """Nodes with totals, free resources and idle time; pending demands, gangs, constraints."""
    if token is not None:
        _fail(TOKEN_ON_COMMAND_LINE, 2)
    try:
        with _client(
            gcs, read_token_file(token_file), timeout, tls_ca, tls_cert, tls_key, tls_server_name
        ) as client:
            state = client.cluster_state()
    except RayInvalidArgument as exc:
        _fail(str(exc), 2)
    except RayError as exc:
        _fail(str(exc), 1)
    if as_json:
        sys.stdout.write(state.model_dump_json(indent=2) + "\n")
    else:
        print_status(state, Console(width=160))


@ray_app.command("resize")
def resize_cmd(
    gcs: GcsOption,
    cpu: Annotated[str, typer.Option("--cpu", help='CPU cores: "4", "1.5" or "1500m".')],
    memory: Annotated[str, typer.Option("--memory", help='Memory: "8Gi", "4G", "4e9" bytes.')],
    node: Annotated[
        str | None,
        typer.Option("--node", help="Node id (hex, or a unique prefix).", show_default=False),
    ] = None,
    pod: Annotated[
        str | None,
        typer.Option("--pod", help="Pod name (the Raylet's instance id).", show_default=False),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    outside_raysize: Annotated[
        bool,
        typer.Option(
            "--outside-raysize",
            help="Required: you know this changes only the Raylet, behind raysize's back.",
        ),
    ] = False,
    token_file: TokenFileOption = None,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    tls_ca: CaOption = None,
    tls_cert: CertOption = None,
    tls_key: KeyOption = None,
    tls_server_name: ServerNameOption = None,
) -> None:
    """Set a Raylet's logical CPU and memory; prints the totals the Raylet applied.

    A debugging tool. It changes only Ray's view: the pod keeps its size, no resize saga
    records it, and a running saga or raysize's next reconcile may set the Raylet back. To
    resize a pod, let raysize do it (or pause its cluster first: raysize pause NS/CLUSTER).
    Refused without --outside-raysize."""
    if token is not None:
        _fail(TOKEN_ON_COMMAND_LINE, 2)
    if not outside_raysize:
        _fail(
            "ray resize changes the Raylet behind raysize's back (the pod keeps its size, "
            "no saga records it): add --outside-raysize if that is what you want",
            2,
        )
    if (node is None) == (pod is None):
        _fail("give exactly one of --node and --pod", 2)
    try:
        cpu_units = quantity_to_units(cpu, CPU, what="--cpu")
        memory_units = quantity_to_units(memory, MEMORY, what="--memory")
        # The checks the client makes before a resize, made before the state is read.
        resize_request({CPU: units_to_float(cpu_units, CPU), MEMORY: float(memory_units)})
    except (QuantityError, RayInvalidArgument) as exc:
        _fail(str(exc), 2)
    try:
        token_value = read_token_file(token_file)
    except RayInvalidArgument as exc:
        _fail(str(exc), 2)
    try:
        with _client(
            gcs, token_value, timeout, tls_ca, tls_cert, tls_key, tls_server_name
        ) as client:
            found = resolve_node(client.cluster_state(), node=node, pod=pod)
            applied = client.resize_raylet(
                found.node_id, units_to_float(cpu_units, CPU), float(memory_units)
            )
    except RayInvalidArgument as exc:
        _fail(str(exc), 2)
    except (RayError, LookupError) as exc:
        _fail(str(exc), 1)
    target = Resources({CPU: cpu_units, MEMORY: memory_units})
    clamped = applied.cpu != cpu_units or applied.memory != memory_units
    if as_json:
        doc = {
            "node_id": found.node_id,
            "pod": found.pod,
            "requested": {CPU: units_to_float(cpu_units, CPU), MEMORY: memory_units},
            "applied": applied.to_ray(),
            "clamped": clamped,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    name = found.pod or found.node_id
    sys.stdout.write(
        f"{name} ({found.node_id[:12]}): CPU {_cpu(applied)}, memory {_memory(applied)}\n"
    )
    if clamped:
        sys.stdout.write(
            f"  asked for CPU {_cpu(target)}, memory {_memory(target)}: "
            "the Raylet kept what its tasks are using\n"
        )
