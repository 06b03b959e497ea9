"""`raysize demo`: the whole product on one machine, no cluster needed.

It starts, in this order, and stops in reverse (each by its own PID / process group,
SIGTERM then SIGKILL after a bounded wait):

1. a Temporal dev server (`temporal server start-dev`, in-memory, with the UI and
   raysize's search attributes),
2. the sandbox (in this process: a Kubernetes API server, kubelet and KubeRay simulator,
   with real Ray processes behind the Ray pods),
3. a raysize worker (`python -m worker.cli worker`, its own process group),
4. a RayCluster with `ray.io/ippr`, then a Ray driver (its own process group) whose
   workload needs more than the cluster has.

Then it polls pods, Raylets, demands and resize workflows about four times a second and
shows what changes until the scenario reaches its expected end. Decisions stay in
`workflows/`: this module only starts things, watches, and stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.client import Client, WorkflowExecutionStatus

from raysize.activities.k8s_objects import gcs_address
from raysize.activities.ray_gcs import RayGcsClient
from raysize.activities.ray_state import ClusterState
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.worker.demo_procs import (
    EXIT_INTERRUPTED,
    EXIT_NOT_DONE,
    EXIT_OK,
    POLL_S,
    DemoConfig,
    DemoError,
    Started,
    connect_when_up,
    log_tail,
    preflight,
    start_driver,
    start_server,
    start_worker,
)
from raysize.worker.demo_scenarios import (
    CLUSTER,
    NAMESPACE,
    Progress,
    ResizeView,
    neighbour_pod,
    raycluster,
)
from raysize.worker.demo_view import (
    DemoState,
    JsonSink,
    PodRow,
    RayletRow,
    Reason,
    Sink,
    resize_text,
    summary,
)
from raysize.workflows.contracts import ReconcileStatus, ResizeSagaState
from raysize.workflows.naming import POD_NAME, RESIZE_OUTCOME, RESIZE_PHASE, reconcile_workflow_id
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.resources import CPU, GIB, MEMORY, Resources

log = logging.getLogger("raysize.demo")


# --- polling ---------------------------------------------------------------------------------
def _quantity(rl: dict[str, Any] | None, key: str) -> str:
    return str((rl or {}).get(key, ""))


def pod_row(pod: dict[str, Any]) -> PodRow:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    role = labels.get("ray.io/node-type", "other")
    container = (spec.get("containers") or [{}])[0]
    res = container.get("resources") or {}
    want = res.get("limits") or res.get("requests") or {}
    running: dict[str, Any] = {}
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == container.get("name"):
            r = cs.get("resources") or {}
            running = r.get("limits") or r.get("requests") or {}
    resize = ""
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("PodResizePending", "PodResizeInProgress"):
            resize = f"{cond['type'].removeprefix('PodResize')}"
            if cond.get("reason"):
                resize += f": {cond['reason']}"
    phase = status.get("phase", "?")
    if meta.get("deletionTimestamp"):
        phase = "Terminating"
    return PodRow(
        name=meta["name"],
        role=role,
        phase=phase,
        node=spec.get("nodeName") or "-",
        cpu=_quantity(want, "cpu"),
        memory=_quantity(want, "memory"),
        cpu_now=_quantity(running, "cpu"),
        memory_now=_quantity(running, "memory"),
        resize=resize,
    )


class Watcher:
    """Polls Kubernetes, the Ray GCS and Temporal, and turns changes into events."""

    def __init__(self, state: DemoState, sink: Sink, api: k8s.ApiClient, temporal: Client):
        self.state, self.sink, self.api, self.temporal = state, sink, api, temporal
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.gcs_address = ""
        self._gcs: RayGcsClient | None = None
        self._ray_pids: set[int] = set()
        self.initial_workers: set[str] = set()
        self.workers_seen: set[str] = set()

    def close(self) -> None:
        if self._gcs is not None:
            self._gcs.close()

    # --- Kubernetes ---------------------------------------------------------------------
    def _pods(self) -> list[dict[str, Any]]:
        items = self.core.list_namespaced_pod(NAMESPACE).items
        return [self.api.sanitize_for_serialization(p) for p in items]

    def _gcs_from_status(self) -> str:
        rc: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            "ray.io", "v1", NAMESPACE, "rayclusters", CLUSTER
        )
        return gcs_address(rc)

    async def poll_pods(self) -> None:
        rows = {r.name: r for r in map(pod_row, await asyncio.to_thread(self._pods))}
        for name, row in rows.items():
            if self.state.pods.get(name) != row:
                self.sink.event({"event": "pod", **row.__dict__})
            if row.role == "worker":
                if not self.workers_seen:
                    self.initial_workers.add(name)
                self.workers_seen.add(name)
        for name in self.state.pods.keys() - rows.keys():
            self.sink.event({"event": "pod", "name": name, "phase": "Deleted"})
        self.state.pods = rows
        if not self.gcs_address:
            self.gcs_address = await asyncio.to_thread(self._gcs_from_status)

    def report_ray_processes(self, sandbox: Sandbox) -> None:
        if sandbox.ray is None:
            return
        for rp in sandbox.ray.processes().values():
            if rp.proc.pid not in self._ray_pids:
                self._ray_pids.add(rp.proc.pid)
                self.sink.event(
                    {"event": "process", "role": "ray", "pod": rp.pod, "pid": rp.proc.pid}
                )

    # --- Ray ----------------------------------------------------------------------------
    async def poll_ray(self) -> None:
        if not self.gcs_address:
            return
        if self._gcs is None:
            self._gcs = RayGcsClient(self.gcs_address, timeout=2.0)
        gcs = self._gcs
        try:
            cs: ClusterState = await asyncio.to_thread(gcs.cluster_state)
        except Exception as exc:  # the GCS is starting or gone: show the last state
            log.debug("cluster_state: %s", exc)
            return
        rows: dict[str, RayletRow] = {}
        for n in cs.nodes:
            rows[n.node_id] = RayletRow(
                node_id=n.node_id,
                pod=n.pod,
                status=str(n.status),
                cpu_total=n.total.to_ray().get(CPU, 0),
                cpu_available=n.available.to_ray().get(CPU, 0),
                memory_total_gib=round(n.total.get_units(MEMORY) / GIB, 2),
            )
        for nid, row in rows.items():
            if self.state.raylets.get(nid) != row:
                self.sink.event({"event": "raylet", **row.__dict__})
        self.state.raylets = rows
        demands = tuple(
            [f"{d.count}× {_shape(d.shape)}" for d in cs.demands]
            + [
                f"placement group {' + '.join(_shape(b.shape) for b in g.bundles)} "
                f"{g.strategy.value if hasattr(g.strategy, 'value') else g.strategy}"
                for g in cs.gangs
            ]
        )
        if demands != self.state.demands:
            self.sink.event({"event": "demands", "pending": list(demands)})
        self.state.demands = demands

    # --- Temporal -----------------------------------------------------------------------
    async def poll_resizes(self) -> None:
        query = f"RayCluster='{CLUSTER}' AND WorkflowType='PodResizeWorkflow'"
        async for wf in self.temporal.list_workflows(query, limit=100):
            key = (wf.id, wf.run_id)
            old = self.state.resizes.get(key)
            if old is not None and old.closed:
                continue
            status = wf.status.name if wf.status else "?"
            attrs = wf.typed_search_attributes
            view = ResizeView(
                workflow_id=wf.id,
                run_id=wf.run_id,
                pod=attrs.get(POD_NAME) or wf.id.rsplit("/", 1)[-1],
                status=status,
                phase=attrs.get(RESIZE_PHASE) or "",
                outcome=attrs.get(RESIZE_OUTCOME) or "",
                started=wf.start_time.timestamp() if wf.start_time else 0.0,
            )
            rs = await self._resize_state(wf.id, wf.run_id, wf.status)
            if rs is not None:
                view.phase, view.outcome = rs.phase.value, rs.outcome.value
                view.from_cpu, view.cpu = rs.from_cpu, rs.cpu
                view.from_memory, view.memory = rs.from_memory, rs.memory
                view.attempts = tuple(a.result for a in rs.attempts)
                view.attempt_cpus = tuple(a.cpu for a in rs.attempts)
                view.detail = rs.detail
            if view.closed and rs is None:
                view.status = "RUNNING"  # read it again next time
            if old != view:
                self.sink.event(
                    {
                        "event": "resize",
                        "workflow_id": view.workflow_id,
                        "run_id": view.run_id,
                        "pod": view.pod,
                        "phase": view.phase,
                        "outcome": view.outcome,
                        "from_cpu": _cores_text(view.from_cpu),
                        "cpu": _cores_text(view.cpu),
                        "attempts": list(view.attempts),
                        "attempt_cpus": [_cores_text(c) for c in view.attempt_cpus],
                        "detail": view.detail,
                        "closed": view.closed,
                    }
                )
            self.state.resizes[key] = view

    async def _resize_state(
        self, wf_id: str, run_id: str, status: WorkflowExecutionStatus | None
    ) -> ResizeSagaState | None:
        handle = self.temporal.get_workflow_handle_for(PodResizeWorkflow.run, wf_id, run_id=run_id)
        try:
            if status == WorkflowExecutionStatus.COMPLETED:
                return await handle.result(follow_runs=False)
            return await asyncio.wait_for(handle.query(PodResizeWorkflow.state), 5)
        except Exception as exc:  # not started yet, or closed without a result
            log.debug("state of %s: %s", wf_id, exc)
            return None

    async def poll_reasons(self) -> None:
        """The reconcile's own decisions and the notes of its last plan: why each step
        happens, in the planner's words (the demo adds none of its own)."""
        handle = self.temporal.get_workflow_handle(reconcile_workflow_id(NAMESPACE, CLUSTER))
        try:
            st = await asyncio.wait_for(handle.query("status", result_type=ReconcileStatus), 5)
        except Exception as exc:  # not started yet (discovery starts it), or busy
            log.debug("reconcile status: %s", exc)
            return
        seen = {(r.tick, r.text) for r in self.state.reasons}
        for d in st.decisions:
            for text in d.reasons or (d.summary.split(": ", 1)[-1],):
                if (d.tick, text) in seen:
                    continue
                seen.add((d.tick, text))
                reason = Reason(tick=d.tick, text=text, at_s=round(self.state.elapsed(), 1))
                self.state.reasons.append(reason)
                self.sink.event({"event": "decision", "tick": d.tick, "reason": text})
        notes = tuple(st.last_plan.notes) if st.last_plan is not None else ()
        if notes != self.state.plan_notes:
            self.sink.event({"event": "plan_notes", "notes": list(notes)})
        self.state.plan_notes = notes

    async def poll_all(self, sandbox: Sandbox) -> None:
        """One round of polling. A failed read (an API busy for a moment) only leaves that
        part of the view as it was; the story's deadline bounds a lasting failure."""
        self.report_ray_processes(sandbox)
        for part in (self.poll_pods, self.poll_ray, self.poll_resizes, self.poll_reasons):
            try:
                await part()
            except Exception as exc:
                log.warning("%s failed: %r", part.__name__, exc)

    def progress(self, workload_rc: int | None) -> Progress:
        return Progress(
            resizes=list(self.state.resizes.values()),
            initial_workers=self.initial_workers,
            workers_seen=self.workers_seen,
            workload_rc=workload_rc,
        )


# Ray's names for a placement group's resources: `CPU_group_0_<pg id>` (bundle 0's CPU),
# `CPU_group_<pg id>` (any bundle's) and `bundle_group_…` (the bundle's marker)
# a worker pod running this long with no Raylet registered: the story cannot go on, say so
# (Ray takes 2-6 s to register here; the story's own timeout is minutes)
RAYLET_REGISTER_S = 90.0
_PG_BUNDLE = re.compile(r"^(?P<name>.+)_group_(?P<index>\d+)_[0-9a-f]{16,}$")


def _shape(r: Resources) -> str:
    """`{CPU: 2}`; a task waiting for a placement group's bundle reads `{CPU: 2} in
    placement group bundle 0`, not Ray's internal resource names."""
    ray = r.to_ray()
    bundle = {m["name"]: (int(m["index"]), v) for k, v in ray.items() if (m := _PG_BUNDLE.match(k))}
    if bundle:
        plain = {name: v for name, (_, v) in bundle.items() if name != "bundle"}
        indexes = sorted({i for i, _ in bundle.values()})
        where = ", ".join(str(i) for i in indexes)
        return _braces(plain) + f" in placement group bundle {where}"
    return _braces(ray)


def _braces(ray: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(ray.items())) + "}"


def _cores_text(units: int) -> str:
    return f"{units / 1000:g}"


# --- the story -------------------------------------------------------------------------------
def _read_driver(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))


async def story(
    cfg: DemoConfig,
    started: Started,
    sink: Sink,
    temporal_bin: str,
    ended: Callable[[int], None],
) -> None:
    """Tell the story; `ended(code)` once it reached its end (or its deadline). With
    `cfg.stay` it then goes on showing the cluster until cancelled (Ctrl-C)."""
    scenario = cfg.scenario
    state = DemoState(scenario=scenario, ui_port=cfg.ui_port)

    def stage(text: str) -> None:
        state.stage = text
        sink.event({"event": "stage", "message": text, "t": round(state.elapsed(), 1)})
        sink.refresh(state)

    stage(f"starting the Temporal dev server on port {cfg.temporal_port}")
    server = start_server(started, temporal_bin, cfg)
    temporal = await connect_when_up(
        f"127.0.0.1:{cfg.temporal_port}", server, started.workdir / "temporal.log"
    )
    stage("starting the sandbox (Kubernetes API, kubelet, KubeRay, real Ray processes)")
    sandbox = Sandbox(
        SandboxConfig(
            node_specs=list(scenario.nodes),
            with_ray=True,
            timing=KubeletTiming(actuation_delay_s=0.5),
        )
    )
    started.sandbox = sandbox
    await asyncio.to_thread(sandbox.start)
    kubeconfig = sandbox.write_kubeconfig(started.workdir / "kubeconfig")
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    stage("starting the raysize worker")
    idle = float(scenario.idle_timeout_s if scenario.idle_timeout_s is not None else 60)
    worker = start_worker(started, cfg, kubeconfig, idle)
    sink.event(
        {
            "event": "started",
            "message": f"Temporal UI: http://localhost:{cfg.ui_port}  kubeconfig: {kubeconfig}",
            "pids": {"demo": os.getpid(), "temporal": server.pid, "worker": worker.pid},
            "temporal_address": f"127.0.0.1:{cfg.temporal_port}",
            "ui": f"http://localhost:{cfg.ui_port}",
            "kubeconfig": str(kubeconfig),
            "workdir": str(started.workdir),
        }
    )
    watcher = Watcher(state, sink, api, temporal)
    try:
        custom = k8s.CustomObjectsApi(api)
        if scenario.neighbour_cpu:
            pod: Any = neighbour_pod(scenario.neighbour_cpu, scenario.nodes[0].name)
            await asyncio.to_thread(k8s.CoreV1Api(api).create_namespaced_pod, NAMESPACE, pod)
        stage(f"creating RayCluster {NAMESPACE}/{CLUSTER} (1 worker of 1 CPU, growable to 4)")
        await asyncio.to_thread(
            custom.create_namespaced_custom_object,
            "ray.io",
            "v1",
            NAMESPACE,
            "rayclusters",
            raycluster(scenario),
        )
        code = await _watch(cfg, started, sink, state, watcher, stage)
        ended(code)
        if cfg.stay:
            sink.event(
                {
                    "event": "staying",
                    "message": f"The Temporal UI stays up at http://localhost:{cfg.ui_port} "
                    "(the links above work); the cluster keeps running and the view keeps "
                    "following it. Press Ctrl-C to stop everything.",
                }
            )
            await _follow(started, sink, state, watcher)
    finally:
        watcher.close()


async def _watch(
    cfg: DemoConfig,
    started: Started,
    sink: Sink,
    state: DemoState,
    watcher: Watcher,
    stage: Any,
) -> int:
    scenario = cfg.scenario
    deadline = time.monotonic() + cfg.timeout_s
    lines: list[str] = []
    shown = 0
    running_since: dict[str, float] = {}  # worker pod → when it was first seen running
    while True:
        assert started.sandbox is not None
        if started.worker is not None and started.worker.poll() is not None:
            raise DemoError(
                f"the raysize worker exited with code {started.worker.returncode}:\n"
                f"{log_tail(started.workdir / 'worker.log')}"
            )
        await watcher.poll_all(started.sandbox)
        workers_up = [p for p in state.pods.values() if p.role == "worker" and p.phase == "Running"]
        registered = {r.pod for r in state.raylets.values() if r.status in ("running", "idle")}
        now = time.monotonic()
        for p in workers_up:
            since = running_since.setdefault(p.name, now)
            if p.name not in registered and now - since > RAYLET_REGISTER_S:
                # say which step never happened, long before the story's own timeout
                raise DemoError(
                    f"the Raylet of pod {p.name} never registered in {RAYLET_REGISTER_S:.0f}s "
                    f"after the pod started running (its Ray logs are kept in "
                    f"{started.workdir / 'ray-logs'})"
                )
        if (
            started.driver is None
            and watcher.gcs_address
            and any(p.name in registered for p in workers_up)
        ):
            stage("running the Ray workload: it needs more than the cluster has")
            start_driver(started, watcher.gcs_address, scenario, cfg.timeout_s)
            assert started.driver is not None
            sink.event({"event": "process", "role": "driver", "pid": started.driver.pid})
            started.driver_reader = threading.Thread(
                target=_read_driver, args=(started.driver, lines), daemon=True
            )
            started.driver_reader.start()
        while shown < len(lines):
            line = _name_nodes(lines[shown], state)
            state.workload.append(line)
            sink.event({"event": "workload", "line": line})
            shown += 1
        if started.driver is not None and state.workload_rc is None:
            rc = started.driver.poll()
            if rc is not None and (
                started.driver_reader is None or _drained(started, lines, shown)
            ):
                state.workload_rc = rc
                sink.event({"event": "workload", "exit_code": rc})
                if rc != 0:
                    err = log_tail(started.workdir / "driver.err", 10)
                    raise DemoError(f"the Ray workload failed (exit {rc}):\n{err}")
                stage("workload finished: waiting for the story's end")
        missing = scenario.missing(watcher.progress(state.workload_rc))
        if not missing:
            state.ended = (True, round(state.elapsed()))
            stage("done")
            sink.event(summary(state, True, []))
            return EXIT_OK
        if time.monotonic() > deadline:
            state.ended = (False, round(state.elapsed()))
            doc = summary(state, False, missing)
            sink.event(
                {
                    "event": "error",
                    "message": f"scenario {scenario.name} did not reach its end in "
                    f"{cfg.timeout_s:g}s: {'; '.join(missing)}",
                }
            )
            sink.event(doc)
            return EXIT_NOT_DONE
        sink.refresh(state)
        await asyncio.sleep(POLL_S)


async def _follow(started: Started, sink: Sink, state: DemoState, watcher: Watcher) -> None:
    """After the story: keep showing what the cluster does (an idle pod shrinks, a pod is
    removed) until cancelled."""
    while True:
        assert started.sandbox is not None
        if started.worker is not None and started.worker.poll() is not None:
            raise DemoError(
                f"the raysize worker exited with code {started.worker.returncode}:\n"
                f"{log_tail(started.workdir / 'worker.log')}"
            )
        await watcher.poll_all(started.sandbox)
        sink.refresh(state)
        await asyncio.sleep(POLL_S)


def _drained(started: Started, lines: list[str], shown: int) -> bool:
    reader = started.driver_reader
    if reader is not None:
        reader.join(timeout=1)
        if reader.is_alive():
            return False
    return shown >= len(lines)


def _name_nodes(line: str, state: DemoState) -> str:
    """Replace a Ray node id the driver printed with the pod it runs in."""
    words = line.split()
    if words and len(words[-1]) == 56 and all(c in "0123456789abcdef" for c in words[-1]):
        return " ".join([*words[:-1], f"{words[-1][:8]}… (pod {state.pod_of_node(words[-1])})"])
    return line


# --- entry point -----------------------------------------------------------------------------
@contextlib.contextmanager
def _signals_ignored_while_stopping() -> Iterator[None]:
    """A second Ctrl-C must not cut the cleanup short: it is bounded anyway."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, frame: FrameType | None) -> None:
        log.warning("signal %d while stopping: still stopping", signum)

    for s in previous:
        signal.signal(s, note)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _keep_ray_logs(started: Started, workdir: Path) -> None:
    """A failed story keeps what explains it: every pod's Ray logs (the sandbox removes
    its temp dir when it stops) beside the demo's, worker's and server's logs."""
    ray = started.sandbox.ray if started.sandbox is not None else None
    if ray is not None:
        with contextlib.suppress(OSError):
            ray.keep_logs(workdir / "ray-logs")


def run_demo(cfg: DemoConfig, sink: Sink) -> int:
    """Run one scenario; returns the exit code (0 done, 1 not done, 2 usage, 130 signal)."""
    try:
        temporal_bin, _ = preflight(cfg)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except DemoError as exc:
        sys.stderr.write(f"error: {exc}\n")
        if isinstance(sink, JsonSink):
            sink.event({"event": "error", "message": str(exc), "exit_code": exc.code})
        return exc.code
    workdir = Path(tempfile.mkdtemp(prefix="raysize-demo-"))
    logging.basicConfig(
        filename=str(workdir / "demo.log"),
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        force=True,
    )
    started = Started(workdir=workdir)
    code = EXIT_NOT_DONE
    interrupted = False
    told: int | None = None  # the story's own result, once it has one

    async def main() -> int:
        nonlocal interrupted, told
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            nonlocal interrupted
            interrupted = True
            task.cancel()

        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, on_signal, s)

        def ended(code: int) -> None:
            nonlocal told
            told = code

        try:
            await story(cfg, started, sink, temporal_bin, ended)
            assert told is not None
            return told
        finally:
            for s in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(s)

    try:
        code = asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
    except DemoError as exc:
        sink.event({"event": "error", "message": str(exc), "logs": str(workdir)})
        code = exc.code
        _keep_ray_logs(started, workdir)
    except Exception as exc:
        log.exception("demo failed")
        sink.event({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        code = EXIT_NOT_DONE
    finally:
        sink.close()
        with _signals_ignored_while_stopping():
            sink.event({"event": "stopping", "message": "stopping everything the demo started"})
            problems, took = started.stop_all()
            sink.event({"event": "stopped", "problems": problems, "seconds": took})
    if interrupted and told is not None:
        code = told  # Ctrl-C after the story ended: the story's result stands
    elif interrupted:
        sink.event({"event": "interrupted", "message": "interrupted: everything was stopped"})
        code = EXIT_INTERRUPTED
    if code == EXIT_NOT_DONE or cfg.keep_logs:
        sink.event({"event": "logs", "workdir": str(workdir)})
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


__all__ = ["DemoConfig", "DemoError", "preflight", "resize_text", "run_demo"]
