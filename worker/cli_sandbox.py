"""`raysize sandbox up`: a local Kubernetes stand-in (API server, kubelet, KubeRay)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import typer

from raysize.worker.cli_common import DEV_PANEL, before_exit, stand_ins, usage_error
from raysize.workflows.resources import CPU, MEMORY, QuantityError, quantity_to_units

DEFAULT_KUBECONFIG = Path.home() / ".kube" / "raysize-sandbox.yaml"


def register(app: typer.Typer) -> None:
    sandbox_app = typer.Typer(
        help="A local stand-in for a Kubernetes cluster with KubeRay, for demos and tests.",
        no_args_is_help=True,
    )
    app.add_typer(sandbox_app, name="sandbox", rich_help_panel=DEV_PANEL)

    @sandbox_app.command("up")
    def up(
        nodes: int = typer.Option(1, "--nodes", help="number of simulated nodes"),
        node_cpu: str = typer.Option("8", "--node-cpu", help="CPU per node, a quantity: 8, 7500m"),
        node_memory: str = typer.Option(
            "32Gi", "--node-memory", help="memory per node, a quantity: 32Gi, 64G"
        ),
        with_ray: bool = typer.Option(
            False, "--with-ray", help="back each Ray pod with real Ray processes"
        ),
        kubeconfig: Path = typer.Option(
            DEFAULT_KUBECONFIG, "--kubeconfig", help="where to write the kubeconfig"
        ),
        port: int = typer.Option(0, "--port", help="API server port (0: any free port)"),
        max_pods: int = typer.Option(110, "--max-pods", help="pods per node"),
        actuation_delay: float = typer.Option(
            1.0, "--actuation-delay", help="seconds the kubelet takes to actuate a resize"
        ),
        retry_interval: float = typer.Option(
            180.0, "--retry-interval", help="seconds between the kubelet's deferred-resize retries"
        ),
        fault: list[str] = typer.Option(
            [],
            "--fault",
            metavar="RULE",
            help=(
                "inject API faults, repeatable, first match wins: comma-separated key=value "
                "with verb (get, list, watch, create, update, patch, delete, *), resource "
                "(pods, pods/resize, pods/status, rayclusters, pods/*, *), status "
                "(409|429|500), rate (0..1; 1 with a status alone), latency (s), "
                "disconnect (s: cut watches), times (at most this many errors); e.g. "
                "'verb=patch,resource=pods/resize,status=409,rate=0.1'. With "
                "--control-plane real: for the clients of the written kubeconfig, through a "
                "proxy (<kubeconfig>.direct goes around it)"
            ),
        ),
        fault_seed: int = typer.Option(
            0, "--fault-seed", help="seed of the fault dice (the same seed, the same faults)"
        ),
        control_plane: str = typer.Option(
            "embedded",
            "--control-plane",
            help=(
                "embedded: the built-in API server and KubeRay stand-in (no dependencies); "
                "real: etcd + kube-apiserver v1.36 (HTTPS, RBAC) + the real KubeRay operator, "
                "built from Go modules on first use (needs Go; ~10 min once, then cached)"
            ),
        ),
    ) -> None:
        """Run the sandbox in the foreground until Ctrl-C."""
        # a development tool: `raysize worker` never loads the sandbox
        with stand_ins("sandbox up"):
            from raysize.sandbox import reaper
            from raysize.sandbox.cluster import Sandbox, SandboxConfig
            from raysize.sandbox.faults import describe, parse_fault
            from raysize.sandbox.kubelet import KubeletTiming
            from raysize.sandbox.realworld import ControlPlaneError, RealSandbox
        # what a SIGKILL would leave is stopped by the reaper; at a normal exit, wait for it
        before_exit(reaper.close)

        if control_plane not in ("embedded", "real"):
            raise usage_error(f"--control-plane {control_plane!r}: expected 'embedded' or 'real'")
        if control_plane == "real" and port:
            raise usage_error(
                "--port needs the embedded API server (the real one listens on a free port): "
                "drop it, or use --control-plane embedded"
            )
        if nodes < 1:
            raise usage_error(f"--nodes {nodes}: expected at least 1")
        if max_pods < 1:
            raise usage_error(f"--max-pods {max_pods}: expected at least 1")
        if not 0 <= port <= 65535:
            raise usage_error(f"--port {port}: expected 0..65535")
        if actuation_delay < 0 or retry_interval <= 0:
            raise usage_error("--actuation-delay must be >= 0 and --retry-interval > 0")
        try:
            cpu = quantity_to_units(node_cpu, CPU, what="--node-cpu")
            memory = quantity_to_units(node_memory, MEMORY, what="--node-memory")
        except QuantityError as exc:
            raise usage_error(str(exc)) from None
        if cpu <= 0 or memory <= 0:
            raise usage_error("--node-cpu and --node-memory must be positive")
        rules = []
        for text in fault:
            try:
                rules.append(parse_fault(text))
            except ValueError as exc:
                raise usage_error(f"--fault {text!r}: {exc}") from None
        config = SandboxConfig(
            nodes=nodes,
            node_cpu=cpu,
            node_memory=memory,
            with_ray=with_ray,
            port=port,
            max_pods=max_pods,
            fault_seed=fault_seed,
            timing=KubeletTiming(
                actuation_delay_s=actuation_delay,
                retry_initial_s=min(30.0, retry_interval),
                retry_interval_s=retry_interval,
            ),
        )
        sandbox: Sandbox | RealSandbox
        try:
            sandbox = Sandbox(config) if control_plane == "embedded" else RealSandbox(config)
        except OSError as exc:
            raise usage_error(f"cannot listen on port {port}: {exc.strerror}") from None
        except ControlPlaneError as exc:
            raise usage_error(f"the real control plane: {exc}") from None
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for rule in rules:
            sandbox.faults.add(rule)
        previous = signal.signal(signal.SIGTERM, on_signal)
        # Ctrl-C stops it too, even when started with SIGINT ignored (a background job of a
        # shell without job control ignores it, and Python then raises no KeyboardInterrupt)
        previous_int = signal.signal(signal.SIGINT, on_signal)
        try:
            try:
                sandbox.start()
            except ControlPlaneError as exc:
                raise usage_error(f"the real control plane did not start: {exc}") from None
            direct = ""
            if isinstance(sandbox, Sandbox):
                path = sandbox.write_kubeconfig(kubeconfig)
            else:
                # the real API server's faults are a proxy's, in front of it for the
                # clients of this kubeconfig (the kubelet and KubeRay reach it directly)
                path = sandbox.write_kubeconfig(kubeconfig, faults=bool(rules))
                if rules:
                    plain = sandbox.write_kubeconfig(
                        kubeconfig.with_name(f"{kubeconfig.name}.direct")
                    )
                    direct = (
                        "  faults apply to clients of that kubeconfig, through a proxy that "
                        "does not relay kubectl exec, attach or port-forward; without faults:\n"
                        f"  export KUBECONFIG={plain}\n"
                    )
            kind = (
                "embedded API server"
                if isinstance(sandbox, Sandbox)
                else f"kube-apiserver {sandbox.control_plane.version} + KubeRay "
                f"{sandbox.control_plane.parts.kuberay_version}"
            )
            typer.echo(
                f"raysize sandbox: Kubernetes API at {sandbox.url} ({kind}; "
                f"{nodes} node(s), {node_cpu} CPU / {node_memory} each"
                f"{', Ray processes on' if with_ray else ''})\n"
                f"  export KUBECONFIG={path}\n"
                f"  kubectl get nodes; kubectl get raycluster; kubectl get pods\n"
                + "".join(f"  fault: {describe(rule)}\n" for rule in rules)
                + direct
                + "Ctrl-C stops everything."
            )
            while not stop.wait(0.5):
                pass
            typer.echo("raysize sandbox: stopping")
        finally:
            sandbox.close()
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
