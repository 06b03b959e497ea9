"""`ray.io/ippr` validation: Ray's format accepted exactly, every problem reported at once."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from raysize.workflows.ippr import IPPR_ANNOTATION
from raysize.workflows.ippr_status import IpprStatus
from raysize.workflows.kubelet_messages import parse_kubelet_message
from raysize.workflows.model import PlannerSettings, UpscalingMode
from raysize.workflows.raycluster_spec import read_group_specs, read_planner_settings
from raysize.workflows.resources import GIB, Resources


def container(requests: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "ray-worker", "image": "rayproject/ray:2.60.0"}
    c["resources"] = {
        "requests": requests if requests is not None else {"cpu": "1", "memory": "2Gi"}
    }
    c.update(extra)
    return c


QUANTITY = (
    "expected a non-negative Kubernetes quantity: a number with an optional suffix (m, k, M, "
    'G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent (e.g. 1e3), like "1500m", "2", "8Gi"'
)


def template(
    requests: dict[str, Any] | None = None, *, limits: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A worker group's pod template with these requests and limits."""
    c = container(requests)
    if limits is not None:
        c["resources"]["limits"] = limits
    return {"template": {"spec": {"containers": [c]}}}


def raycluster(ippr: object = None, *, worker: dict[str, Any] | None = None) -> dict[str, Any]:
    w = {
        "groupName": "small",
        "replicas": 1,
        "minReplicas": 0,
        "maxReplicas": 10,
        "rayStartParams": {},
        "template": {"spec": {"containers": [container()]}},
    }
    if worker:
        w.update(worker)
    rc: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "demo", "namespace": "default", "annotations": {}},
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": {"spec": {"containers": [container({"cpu": "500m", "memory": "1Gi"})]}},
            },
            "workerGroupSpecs": [w],
        },
    }
    if ippr is not None:
        rc["metadata"]["annotations"][IPPR_ANNOTATION] = (
            ippr if isinstance(ippr, str) else json.dumps(ippr)
        )
    return rc


GOOD = {"groups": {"small": {"max-cpu": "4", "max-memory": "8Gi", "resize-timeout": 60}}}


def test_rays_own_example_is_accepted() -> None:
    specs = read_group_specs(raycluster(GOOD))
    assert specs.ok and specs.ippr_enabled
    small = specs.groups["small"]
    assert small.ippr is not None
    assert (small.ippr.max_cpu, small.ippr.max_memory, small.ippr.resize_timeout_s) == (
        4000,
        8 * GIB,
        60,
    )
    assert small.resources == Resources.of(cpu=1000, memory=2 * GIB)
    assert (small.min_workers, small.max_workers) == (0, 10)
    assert specs.groups["headgroup"].is_head
    assert specs.groups["headgroup"].resources.cpu == 0  # num-cpus: 0 on the head


def test_numbers_and_head_group_are_accepted_like_ray() -> None:
    ann = {
        "groups": {
            "small": {"max-cpu": 2.5, "max-memory": 4294967296, "resize-timeout": 5},
            "headgroup": {"max-cpu": "2", "max-memory": "2Gi", "resize-timeout": 30},
        }
    }
    rc = raycluster(ann)
    rc["spec"]["headGroupSpec"]["rayStartParams"] = {}
    specs = read_group_specs(rc)
    assert specs.ok, [str(e) for e in specs.errors]
    assert specs.groups["small"].ippr is not None
    assert specs.groups["small"].ippr.max_cpu == 2500
    assert specs.groups["headgroup"].ippr is not None


def test_limits_are_the_size_when_set_like_ray() -> None:
    c = container({"cpu": "1", "memory": "2Gi"})
    c["resources"]["limits"] = {"cpu": "2", "memory": "4Gi"}
    specs = read_group_specs(raycluster(GOOD, worker={"template": {"spec": {"containers": [c]}}}))
    assert specs.groups["small"].resources == Resources.of(cpu=2000, memory=4 * GIB)


def test_no_annotation_means_no_ippr_and_no_errors() -> None:
    specs = read_group_specs(raycluster())
    assert specs.ok and not specs.ippr_enabled
    assert specs.groups["small"].ippr is None


def _errors(rc: dict[str, Any]) -> list[str]:
    return [str(e) for e in read_group_specs(rc).errors]


def _ann(**small: Any) -> dict[str, Any]:
    entry = dict(GOOD["groups"]["small"])
    for k, v in small.items():
        key = k.replace("_", "-")
        if v is ...:
            entry.pop(key)
        else:
            entry[key] = v
    return {"groups": {"small": entry}}


# (name, raycluster, exact expected errors)
CORPUS: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "invalid json",
        raycluster('{"groups": {"small": '),
        [
            "metadata.annotations[ray.io/ippr]: is not valid JSON (Expecting value at line 1 "
            'column 22); write it like {"groups": {"<group>": {"max-cpu": "4", '
            '"max-memory": "8Gi", "resize-timeout": 60}}}'
        ],
    ),
    (
        "top level is a list",
        raycluster("[1, 2]"),
        [
            "metadata.annotations[ray.io/ippr]: is an array, not an object; write it like "
            '{"groups": {"<group>": {"max-cpu": "4", "max-memory": "8Gi", "resize-timeout": 60}}}'
        ],
    ),
    (
        "groups is a list",
        raycluster({"groups": ["small"]}),
        [
            "groups: is an array, not an object; map each group name to its limits: "
            '{"groups": {"<group>": {"max-cpu": "4", "max-memory": "8Gi", "resize-timeout": 60}}}'
        ],
    ),
    (
        "unknown group",
        raycluster({"groups": {"big": GOOD["groups"]["small"]}}),
        [
            "group 'big', groups: is not a group of this RayCluster; use one of: headgroup, "
            "small (the head group is 'headgroup')"
        ],
    ),
    (
        "group entry is a string",
        raycluster({"groups": {"small": "4"}}),
        [
            "group 'small', groups: the entry is a string, not an object; give "
            '{"max-cpu": ..., "max-memory": ..., "resize-timeout": ...}'
        ],
    ),
    (
        "max-cpu missing",
        raycluster(_ann(max_cpu=...)),
        [
            'group \'small\', max-cpu: is missing; add "max-cpu", a quantity string like "4" or a number'
        ],
    ),
    (
        "max-memory missing",
        raycluster(_ann(max_memory=...)),
        [
            'group \'small\', max-memory: is missing; add "max-memory", a quantity like "8Gi" or bytes'
        ],
    ),
    (
        "resize-timeout missing",
        raycluster(_ann(resize_timeout=...)),
        [
            "group 'small', resize-timeout: is missing; add \"resize-timeout\", whole seconds like 60"
        ],
    ),
    (
        "max-cpu garbage",
        raycluster(_ann(max_cpu="4 cores")),
        [
            "group 'small', max-cpu: '4 cores' is not a quantity; expected a non-negative "
            "Kubernetes quantity: a number with an optional suffix (m, k, M, G, T, P, E, Ki, Mi, "
            'Gi, Ti, Pi, Ei) or exponent (e.g. 1e3), like "1500m", "2", "8Gi"; use a quantity '
            'like "4", "1500m" or 4'
        ],
    ),
    (
        "max-cpu boolean",
        raycluster(_ann(max_cpu=True)),
        [
            'group \'small\', max-cpu: True is a boolean; use a string quantity like "4" or "1500m", or a number'
        ],
    ),
    (
        "max-cpu object",
        raycluster(_ann(max_cpu={"cores": 4})),
        [
            "group 'small', max-cpu: {'cores': 4} is an object; use a string quantity like \"4\" or \"1500m\", or a number"
        ],
    ),
    (
        "max-cpu zero",
        raycluster(_ann(max_cpu=0)),
        ["group 'small', max-cpu: 0 is zero; give a positive CPU amount"],
    ),
    (
        "max-cpu negative",
        raycluster(_ann(max_cpu="-2")),
        [
            "group 'small', max-cpu: '-2' is negative; expected a non-negative Kubernetes "
            "quantity: a number with an optional suffix (m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, "
            'Ei) or exponent (e.g. 1e3), like "1500m", "2", "8Gi"; use a quantity like "4", '
            '"1500m" or 4'
        ],
    ),
    (
        "max-memory float (Ray's schema says integer)",
        raycluster(_ann(max_memory=8.5)),
        [
            "group 'small', max-memory: 8.5 is a decimal number; use a string quantity like \"8Gi\" or an "
            "integer number of bytes"
        ],
    ),
    (
        "max-memory bad suffix",
        raycluster(_ann(max_memory="8GB")),
        [
            "group 'small', max-memory: '8GB' is not a quantity; expected a non-negative "
            "Kubernetes quantity: a number with an optional suffix (m, k, M, G, T, P, E, Ki, Mi, "
            'Gi, Ti, Pi, Ei) or exponent (e.g. 1e3), like "1500m", "2", "8Gi"; use a quantity '
            'like "8Gi", "512Mi" or an integer of bytes'
        ],
    ),
    (
        "max-memory too large",
        raycluster(_ann(max_memory="100000Ei")),
        [
            "group 'small', max-memory: '100000Ei' is too large; expected a Kubernetes "
            'quantity of at most 9223372036854775807 bytes; use a quantity like "8Gi", "512Mi" '
            "or an integer of bytes"
        ],
    ),
    (
        "resize-timeout string",
        raycluster(_ann(resize_timeout="60")),
        [
            "group 'small', resize-timeout: '60' is a string, not an integer; give whole seconds like 60"
        ],
    ),
    (
        "resize-timeout float",
        raycluster(_ann(resize_timeout=1.5)),
        [
            "group 'small', resize-timeout: 1.5 is a decimal number, not an integer; give whole seconds like 60"
        ],
    ),
    (
        "resize-timeout zero",
        raycluster(_ann(resize_timeout=0)),
        ["group 'small', resize-timeout: 0 is not positive; give whole seconds, at least 1"],
    ),
    (
        "resize-timeout negative",
        raycluster(_ann(resize_timeout=-5)),
        ["group 'small', resize-timeout: -5 is not positive; give whole seconds, at least 1"],
    ),
    (
        "max-cpu below template",
        raycluster(_ann(max_cpu="500m")),
        [
            "group 'small', max-cpu: 500m is below the template size 1; raise max-cpu to at least 1 or lower the template"
        ],
    ),
    (
        "max-memory below template",
        raycluster(_ann(max_memory="1Gi")),
        [
            "group 'small', max-memory: 1Gi is below the template size 2Gi; raise max-memory to "
            "at least 2Gi or lower the template"
        ],
    ),
    (
        "num-cpus in rayStartParams",
        raycluster(GOOD, worker={"rayStartParams": {"num-cpus": "1"}}),
        [
            "group 'small', rayStartParams.num-cpus: is set, so Ray's logical resources would not "
            "follow the pod's size; remove 'num-cpus' from rayStartParams; Ray reads the size "
            "from the container"
        ],
    ),
    (
        "memory in rayStartParams",
        raycluster(GOOD, worker={"rayStartParams": {"memory": "2147483648"}}),
        [
            "group 'small', rayStartParams.memory: is set, so Ray's logical resources would not "
            "follow the pod's size; remove 'memory' from rayStartParams; Ray reads the size from "
            "the container"
        ],
    ),
    (
        "cpu request missing",
        raycluster(
            GOOD, worker={"template": {"spec": {"containers": [container({"memory": "2Gi"})]}}}
        ),
        [
            "group 'small', template.spec.containers[0].resources.requests.cpu: is missing; set a "
            "cpu request: it is the size a new pod starts at and the lower bound"
        ],
    ),
    (
        "no requests at all",
        raycluster(GOOD, worker={"template": {"spec": {"containers": [container({})]}}}),
        [
            "group 'small', template.spec.containers[0].resources.requests.cpu: is missing; set a "
            "cpu request: it is the size a new pod starts at and the lower bound",
            "group 'small', template.spec.containers[0].resources.requests.memory: is missing; "
            "set a memory request: it is the size a new pod starts at and the lower bound",
        ],
    ),
    (
        "restart policy RestartContainer",
        raycluster(
            GOOD,
            worker={
                "template": {
                    "spec": {
                        "containers": [
                            container(
                                resizePolicy=[
                                    {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                                    {"resourceName": "memory", "restartPolicy": "RestartContainer"},
                                ]
                            )
                        ]
                    }
                }
            },
        ),
        [
            "group 'small', template.spec.containers[0].resizePolicy[1].restartPolicy: is "
            "'RestartContainer' for memory, which restarts the Ray container; set it to "
            "'NotRequired' (or leave it out)"
        ],
    ),
    (
        "no containers",
        raycluster(GOOD, worker={"template": {"spec": {"containers": []}}}),
        [
            "group 'small', template.spec.containers[0]: is missing; give the group a pod "
            "template with a Ray container"
        ],
    ),
    (
        "template request is garbage",
        raycluster(
            GOOD,
            worker={
                "template": {"spec": {"containers": [container({"cpu": "one", "memory": "2Gi"})]}}
            },
        ),
        [
            "group 'small', template.spec.containers[0].resources.requests.cpu: 'one' is not a "
            f"quantity; {QUANTITY}; use a Kubernetes quantity such as 2, 1500m or 8Gi"
        ],
    ),
    (
        "template limit is garbage",
        raycluster(GOOD, worker=template(limits={"cpu": "2", "memory": "4 gigs"})),
        [
            "group 'small', template.spec.containers[0].resources.limits.memory: '4 gigs' is not "
            f"a quantity; {QUANTITY}; use a Kubernetes quantity such as 2, 1500m or 8Gi"
        ],
    ),
    (
        "template request is negative under a valid limit",
        raycluster(GOOD, worker=template({"cpu": "-1", "memory": "2Gi"}, limits={"cpu": "2"})),
        [
            "group 'small', template.spec.containers[0].resources.requests.cpu: '-1' is "
            f"negative; {QUANTITY}; use a Kubernetes quantity such as 2, 1500m or 8Gi"
        ],
    ),
    (
        "template request and limit both garbage, without IPPR",
        raycluster(worker=template({"cpu": "1", "memory": "lots"}, limits={"memory": True})),
        [
            "group 'small', template.spec.containers[0].resources.requests.memory: 'lots' is "
            f"not a quantity; {QUANTITY}; use a Kubernetes quantity such as 2, 1500m or 8Gi",
            "group 'small', template.spec.containers[0].resources.limits.memory: True is a "
            f"boolean; {QUANTITY}; use a Kubernetes quantity such as 2, 1500m or 8Gi",
        ],
    ),
    (
        "GPU limit is garbage",
        raycluster(GOOD, worker=template(limits={"nvidia.com/gpu": "one"})),
        [
            "group 'small', template.spec.containers[0].resources.limits.nvidia.com/gpu: 'one' "
            f"is not a quantity; {QUANTITY}; use a whole number of GPUs"
        ],
    ),
    (
        "num-gpus is not a number",
        raycluster(worker={"rayStartParams": {"num-gpus": "two"}}),
        ["group 'small', rayStartParams.num-gpus: 'two' is not a number; give a number like \"2\""],
    ),
    (
        "num-gpus is negative",
        raycluster(worker={"rayStartParams": {"num-gpus": "-1"}}),
        [
            "group 'small', rayStartParams.num-gpus: '-1' is negative; expected a non-negative "
            'number of units; give a number like "2"'
        ],
    ),
    (
        "custom resource is negative",
        raycluster(worker={"rayStartParams": {"resources": '{"custom": -1}'}}),
        [
            "group 'small', rayStartParams.resources: custom: -1.0 is negative; expected a "
            "non-negative number of units; write it like '{\"custom\": 1}'"
        ],
    ),
]


@pytest.mark.parametrize(("case", "rc", "expected"), CORPUS, ids=[c[0] for c in CORPUS])
def test_validation_corpus(case: str, rc: dict[str, Any], expected: list[str]) -> None:
    assert _errors(rc) == expected


def test_corpus_is_at_least_25_cases() -> None:
    assert len(CORPUS) >= 25


def test_every_problem_is_reported_at_once() -> None:
    ann = {
        "groups": {
            "small": {"max-cpu": "lots", "max-memory": 1.5, "resize-timeout": 0},
            "ghost": {"max-cpu": 1, "max-memory": "1Gi", "resize-timeout": 1},
        }
    }
    rc = raycluster(ann, worker={"rayStartParams": {"num-cpus": "2"}})
    errors = read_group_specs(rc).errors
    assert [(e.group, e.field) for e in errors] == [
        ("ghost", "groups"),
        ("small", "max-cpu"),
        ("small", "max-memory"),
        ("small", "resize-timeout"),
        ("small", "rayStartParams.num-cpus"),
    ]
    # a broken group gets no IPPR limits, so the planner never resizes it
    assert read_group_specs(rc).groups["small"].ippr is None


def test_fixing_the_annotation_clears_the_errors() -> None:
    rc = raycluster(_ann(max_cpu="x"))
    assert not read_group_specs(rc).ok
    fixed = copy.deepcopy(rc)
    fixed["metadata"]["annotations"][IPPR_ANNOTATION] = json.dumps(GOOD)
    assert read_group_specs(fixed).ok


def test_ippr_status_reads_rays_annotation_and_writes_it_back() -> None:
    written_by_ray = json.dumps(
        {
            "raylet-id": "ab12",
            "resizing-at": 1763776000,
            "suggested-max-cpu": 2.5,
            "suggested-max-memory": 3221225472,
            "last-failed-at": None,
            "last-failed-reason": None,
        }
    )
    status = IpprStatus.from_annotation(written_by_ray)
    assert status.raylet_id == "ab12"
    assert status.resizing_at == 1763776000
    assert status.suggested_max_cpu == 2500
    assert status.suggested_max_memory == 3 * GIB
    assert json.loads(status.to_annotation()) == json.loads(written_by_ray)


def test_ippr_status_tolerates_garbage_as_unset() -> None:
    assert IpprStatus.from_annotation("{not json") == IpprStatus()
    assert IpprStatus.from_annotation('{"suggested-max-cpu": "two"}') == IpprStatus()
    assert IpprStatus.from_annotation(None) == IpprStatus()


def test_kubelet_messages_are_parsed_into_what_the_pod_may_still_request() -> None:
    deferred = parse_kubelet_message(
        "Deferred",
        "Node didn't have enough resource: cpu, requested: 8000, used: 5000, capacity: 9000",
    )
    assert deferred is not None
    assert (deferred.resource, deferred.max_request) == ("cpu", 4000)
    infeasible = parse_kubelet_message(
        "Infeasible",
        "Node didn't have enough capacity: memory, requested: 4718592000, capacity: 4294967296",
    )
    assert infeasible is not None
    assert (infeasible.resource, infeasible.max_request) == ("memory", 4294967296)
    assert (
        parse_kubelet_message("Infeasible", "In-place resize of static-pods is not supported")
        is None
    )
    # Kubernetes 1.36+ refuses the same resize at admission (403, cause NodeCapacity)
    admission = parse_kubelet_message(
        "Infeasible",
        'refused at admission: pods "p" is forbidden: node didn\'t have enough allocatable '
        "resources: cpu, requested: 9000, allocatable: 8000",
    )
    assert admission is not None
    assert (admission.resource, admission.max_request) == ("cpu", 8000)


def test_kuberay_autoscaler_options_feed_the_planner_settings() -> None:
    rc = raycluster()
    rc["spec"]["autoscalerOptions"] = {"upscalingMode": "Conservative", "idleTimeoutSeconds": 30}
    s = read_planner_settings(rc, PlannerSettings())
    assert s.upscaling_mode == UpscalingMode.CONSERVATIVE
    assert s.idle_timeout_s == 30


def _errors_of(annotation: object, **worker: object) -> list[str]:
    rc = raycluster(GOOD, worker=worker or None)
    rc["metadata"]["annotations"][IPPR_ANNOTATION] = annotation
    return [str(e) for e in read_group_specs(rc).errors]


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("", "metadata.annotations[ray.io/ippr]: is empty; write it like"),
        ("   ", "metadata.annotations[ray.io/ippr]: is empty; write it like"),
        ("{}", "groups: is missing; name at least one group"),
        ('{"groups": {}}', "groups: is empty; name at least one group"),
        ("null", "metadata.annotations[ray.io/ippr]: is null, not an object"),
    ],
)
def test_an_annotation_that_asks_for_nothing_is_an_error_not_no_resizing(
    annotation: str, expected: str
) -> None:
    """Present but empty used to mean "no resizing" silently, and raysize then scaled the
    cluster in while work was pending: a config error stops every action instead."""
    (error,) = _errors_of(annotation)
    assert error.startswith(expected)


def test_unknown_keys_are_named_with_the_nearest_known_one() -> None:
    doc = {
        "groups": {"small": {**GOOD["groups"]["small"], "max-gpu": 1, "resize_timeout": 30}},
        "group": {},
    }
    assert _errors_of(json.dumps(doc)) == [
        "metadata.annotations[ray.io/ippr]: has unknown key(s) 'group'; the only key is \"groups\"",
        "group 'small', max-gpu: is not a known key; did you mean 'max-cpu'?",
        "group 'small', resize_timeout: is not a known key; did you mean 'resize-timeout'?",
    ]


def test_min_replicas_above_max_replicas_is_an_error() -> None:
    errors = _errors_of(json.dumps(GOOD), minReplicas=3, maxReplicas=2)
    assert errors == [
        "group 'small', minReplicas: 3 is above maxReplicas 2; make minReplicas at most maxReplicas"
    ]


def test_many_unknown_groups_are_summed_up_in_one_error() -> None:
    doc = {"groups": {**GOOD["groups"], **{f"g{i}": {} for i in range(300)}}}
    (error,) = _errors_of(json.dumps(doc))
    assert error.startswith(
        "groups: names 300 groups this RayCluster does not have: 'g0', 'g1', 'g2', 'g3', 'g4' "
        "and 295 more; use one of:"
    )
    assert len(error) < 300
