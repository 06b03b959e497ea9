from raysize.activities.ray_proto import ray_rpc_pb2 as _ray_rpc_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNSPECIFIED: _ClassVar[NodeStatus]
    RUNNING: _ClassVar[NodeStatus]
    DEAD: _ClassVar[NodeStatus]
    IDLE: _ClassVar[NodeStatus]
    DRAINING: _ClassVar[NodeStatus]

class DrainNodeReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAIN_NODE_REASON_UNSPECIFIED: _ClassVar[DrainNodeReason]
    DRAIN_NODE_REASON_IDLE_TERMINATION: _ClassVar[DrainNodeReason]
    DRAIN_NODE_REASON_PREEMPTION: _ClassVar[DrainNodeReason]
UNSPECIFIED: NodeStatus
RUNNING: NodeStatus
DEAD: NodeStatus
IDLE: NodeStatus
DRAINING: NodeStatus
DRAIN_NODE_REASON_UNSPECIFIED: DrainNodeReason
DRAIN_NODE_REASON_IDLE_TERMINATION: DrainNodeReason
DRAIN_NODE_REASON_PREEMPTION: DrainNodeReason

class AntiAffinityConstraint(_message.Message):
    __slots__ = ("label_name", "label_value")
    LABEL_NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_VALUE_FIELD_NUMBER: _ClassVar[int]
    label_name: str
    label_value: str
    def __init__(self, label_name: _Optional[str] = ..., label_value: _Optional[str] = ...) -> None: ...

class AffinityConstraint(_message.Message):
    __slots__ = ("label_name", "label_value")
    LABEL_NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_VALUE_FIELD_NUMBER: _ClassVar[int]
    label_name: str
    label_value: str
    def __init__(self, label_name: _Optional[str] = ..., label_value: _Optional[str] = ...) -> None: ...

class PlacementConstraint(_message.Message):
    __slots__ = ("anti_affinity", "affinity")
    ANTI_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    anti_affinity: AntiAffinityConstraint
    affinity: AffinityConstraint
    def __init__(self, anti_affinity: _Optional[_Union[AntiAffinityConstraint, _Mapping]] = ..., affinity: _Optional[_Union[AffinityConstraint, _Mapping]] = ...) -> None: ...

class ResourceRequest(_message.Message):
    __slots__ = ("resources_bundle", "placement_constraints", "label_selectors")
    class ResourcesBundleEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_BUNDLE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTORS_FIELD_NUMBER: _ClassVar[int]
    resources_bundle: _containers.ScalarMap[str, float]
    placement_constraints: _containers.RepeatedCompositeFieldContainer[PlacementConstraint]
    label_selectors: _containers.RepeatedCompositeFieldContainer[_ray_rpc_pb2.LabelSelector]
    def __init__(self, resources_bundle: _Optional[_Mapping[str, float]] = ..., placement_constraints: _Optional[_Iterable[_Union[PlacementConstraint, _Mapping]]] = ..., label_selectors: _Optional[_Iterable[_Union[_ray_rpc_pb2.LabelSelector, _Mapping]]] = ...) -> None: ...

class ResourceRequestByCount(_message.Message):
    __slots__ = ("request", "count")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    request: ResourceRequest
    count: int
    def __init__(self, request: _Optional[_Union[ResourceRequest, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class BundleSelector(_message.Message):
    __slots__ = ("resource_requests",)
    RESOURCE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    resource_requests: _containers.RepeatedCompositeFieldContainer[ResourceRequest]
    def __init__(self, resource_requests: _Optional[_Iterable[_Union[ResourceRequest, _Mapping]]] = ...) -> None: ...

class GangResourceRequest(_message.Message):
    __slots__ = ("requests", "details", "bundle_selectors")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_SELECTORS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ResourceRequest]
    details: str
    bundle_selectors: _containers.RepeatedCompositeFieldContainer[BundleSelector]
    def __init__(self, requests: _Optional[_Iterable[_Union[ResourceRequest, _Mapping]]] = ..., details: _Optional[str] = ..., bundle_selectors: _Optional[_Iterable[_Union[BundleSelector, _Mapping]]] = ...) -> None: ...

class ClusterResourceConstraint(_message.Message):
    __slots__ = ("resource_requests",)
    RESOURCE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    resource_requests: _containers.RepeatedCompositeFieldContainer[ResourceRequestByCount]
    def __init__(self, resource_requests: _Optional[_Iterable[_Union[ResourceRequestByCount, _Mapping]]] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("node_id", "instance_id", "ray_node_type_name", "available_resources", "total_resources", "status", "idle_duration_ms", "node_ip_address", "labels")
    class AvailableResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TotalResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RAY_NODE_TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    IDLE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_IP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    instance_id: str
    ray_node_type_name: str
    available_resources: _containers.ScalarMap[str, float]
    total_resources: _containers.ScalarMap[str, float]
    status: NodeStatus
    idle_duration_ms: int
    node_ip_address: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[bytes] = ..., instance_id: _Optional[str] = ..., ray_node_type_name: _Optional[str] = ..., available_resources: _Optional[_Mapping[str, float]] = ..., total_resources: _Optional[_Mapping[str, float]] = ..., status: _Optional[_Union[NodeStatus, str]] = ..., idle_duration_ms: _Optional[int] = ..., node_ip_address: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClusterResourceState(_message.Message):
    __slots__ = ("cluster_resource_state_version", "node_states", "pending_resource_requests", "pending_gang_resource_requests", "cluster_resource_constraints", "cluster_session_name")
    CLUSTER_RESOURCE_STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_STATES_FIELD_NUMBER: _ClassVar[int]
    PENDING_RESOURCE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_GANG_RESOURCE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_RESOURCE_CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SESSION_NAME_FIELD_NUMBER: _ClassVar[int]
    cluster_resource_state_version: int
    node_states: _containers.RepeatedCompositeFieldContainer[NodeState]
    pending_resource_requests: _containers.RepeatedCompositeFieldContainer[ResourceRequestByCount]
    pending_gang_resource_requests: _containers.RepeatedCompositeFieldContainer[GangResourceRequest]
    cluster_resource_constraints: _containers.RepeatedCompositeFieldContainer[ClusterResourceConstraint]
    cluster_session_name: str
    def __init__(self, cluster_resource_state_version: _Optional[int] = ..., node_states: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ..., pending_resource_requests: _Optional[_Iterable[_Union[ResourceRequestByCount, _Mapping]]] = ..., pending_gang_resource_requests: _Optional[_Iterable[_Union[GangResourceRequest, _Mapping]]] = ..., cluster_resource_constraints: _Optional[_Iterable[_Union[ClusterResourceConstraint, _Mapping]]] = ..., cluster_session_name: _Optional[str] = ...) -> None: ...

class GetClusterResourceStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterResourceStateReply(_message.Message):
    __slots__ = ("cluster_resource_state",)
    CLUSTER_RESOURCE_STATE_FIELD_NUMBER: _ClassVar[int]
    cluster_resource_state: ClusterResourceState
    def __init__(self, cluster_resource_state: _Optional[_Union[ClusterResourceState, _Mapping]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "reason", "reason_message", "deadline_timestamp_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    reason: DrainNodeReason
    reason_message: str
    deadline_timestamp_ms: int
    def __init__(self, node_id: _Optional[bytes] = ..., reason: _Optional[_Union[DrainNodeReason, str]] = ..., reason_message: _Optional[str] = ..., deadline_timestamp_ms: _Optional[int] = ...) -> None: ...

class DrainNodeReply(_message.Message):
    __slots__ = ("is_accepted", "rejection_reason_message")
    IS_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTION_REASON_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    is_accepted: bool
    rejection_reason_message: str
    def __init__(self, is_accepted: _Optional[bool] = ..., rejection_reason_message: _Optional[str] = ...) -> None: ...

class ResizeRayletResourceInstancesRequest(_message.Message):
    __slots__ = ("node_id", "resources")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    resources: _containers.ScalarMap[str, float]
    def __init__(self, node_id: _Optional[bytes] = ..., resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ResizeRayletResourceInstancesReply(_message.Message):
    __slots__ = ("total_resources",)
    class TotalResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOTAL_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    total_resources: _containers.ScalarMap[str, float]
    def __init__(self, total_resources: _Optional[_Mapping[str, float]] = ...) -> None: ...
