"""`--with-ray`: worker pods are real Raylets that register in the GCS under their pod names.

One lean test (Ray processes are heavy on a 2-core machine): scale a group to 2, find
both Raylets in the GCS by `instance_id` = pod name, delete one pod, see its Raylet go.
"""

from __future__ import annotations

from kubernetes import client

from raysize.activities.ray_gcs import RayGcsClient
from raysize.sandbox.kubelet import KubeletTiming
from tests.sandbox.conftest import client_for, wait_for
from tests.sandbox.test_kubectl_and_operator import raycluster


def alive_instances(address: str) -> set[str]:
    try:
        with RayGcsClient(address, timeout=5) as gcs:
            nodes = gcs.nodes(alive_only=True)
    except Exception:  # the GCS is not up yet: nothing registered
        return set()
    return {n.pod for n in nodes}


def test_scaling_to_two_starts_two_raylets_and_deleting_one_stops_it(make_sandbox, tmp_path):
    sb = make_sandbox(with_ray=True, node_cpu=8000, timing=KubeletTiming(actuation_delay_s=0.0))
    api = client_for(sb, tmp_path)
    co, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    rc = raycluster(replicas=2)
    co.create_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", rc)
    status = wait_for(
        lambda: (
            (
                s := co.get_namespaced_custom_object(
                    "ray.io", "v1", "default", "rayclusters", "rc"
                ).get("status", {})
            ).get("head")
            and s
        ),
        timeout=30,
    )
    address = f"{status['head']['serviceIP']}:{status['endpoints']['gcs']}"
    assert status["endpoints"]["gcs"] != "6379"  # the real, free GCS port
    workers = wait_for(
        lambda: (
            len(
                w := [
                    p.metadata.name
                    for p in core.list_namespaced_pod(
                        "default", label_selector="ray.io/node-type=worker"
                    ).items
                ]
            )
            == 2
            and w
        )
    )
    head = core.list_namespaced_pod("default", label_selector="ray.io/node-type=head").items[0]
    wait_for(
        lambda: alive_instances(address) >= {*workers, head.metadata.name},
        timeout=120,
        interval=1.0,
    )
    with RayGcsClient(address, timeout=5) as gcs:
        types = {n.pod: n.group for n in gcs.nodes(alive_only=True)}
        totals = {n.pod: n.total for n in gcs.cluster_state().nodes if n.alive}
    assert types[workers[0]] == "small"
    # each Raylet was started with its pod's size (--num-cpus, --memory): 1 CPU, 1Gi
    for w in workers:
        assert (totals[w].cpu, totals[w].memory) == (1000, 1024**3)

    victim = workers[0]
    procs = {p.pod: p.proc for p in sb.ray.processes().values()}
    co.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        "default",
        "rayclusters",
        "rc",
        [
            {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1},
            {
                "op": "replace",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy/workersToDelete",
                "value": [victim],
            },
        ],
        _content_type="application/json-patch+json",
    )
    wait_for(lambda: procs[victim].poll() is not None, timeout=30)
    wait_for(lambda: victim not in alive_instances(address), timeout=60, interval=1.0)
    assert workers[1] in alive_instances(address)
    api.close()
