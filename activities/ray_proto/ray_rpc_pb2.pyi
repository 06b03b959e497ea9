from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LabelSelectorOperator(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LABEL_OPERATOR_UNSPECIFIED: _ClassVar[LabelSelectorOperator]
    LABEL_OPERATOR_IN: _ClassVar[LabelSelectorOperator]
    LABEL_OPERATOR_NOT_IN: _ClassVar[LabelSelectorOperator]
LABEL_OPERATOR_UNSPECIFIED: LabelSelectorOperator
LABEL_OPERATOR_IN: LabelSelectorOperator
LABEL_OPERATOR_NOT_IN: LabelSelectorOperator

class LabelSelectorConstraint(_message.Message):
    __slots__ = ("label_key", "operator", "label_values")
    LABEL_KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_VALUES_FIELD_NUMBER: _ClassVar[int]
    label_key: str
    operator: LabelSelectorOperator
    label_values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, label_key: _Optional[str] = ..., operator: _Optional[_Union[LabelSelectorOperator, str]] = ..., label_values: _Optional[_Iterable[str]] = ...) -> None: ...

class LabelSelector(_message.Message):
    __slots__ = ("label_constraints",)
    LABEL_CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    label_constraints: _containers.RepeatedCompositeFieldContainer[LabelSelectorConstraint]
    def __init__(self, label_constraints: _Optional[_Iterable[_Union[LabelSelectorConstraint, _Mapping]]] = ...) -> None: ...

class NodeDeathInfo(_message.Message):
    __slots__ = ("reason", "reason_message")
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNSPECIFIED: _ClassVar[NodeDeathInfo.Reason]
        EXPECTED_TERMINATION: _ClassVar[NodeDeathInfo.Reason]
        UNEXPECTED_TERMINATION: _ClassVar[NodeDeathInfo.Reason]
        AUTOSCALER_DRAIN_PREEMPTED: _ClassVar[NodeDeathInfo.Reason]
        AUTOSCALER_DRAIN_IDLE: _ClassVar[NodeDeathInfo.Reason]
    UNSPECIFIED: NodeDeathInfo.Reason
    EXPECTED_TERMINATION: NodeDeathInfo.Reason
    UNEXPECTED_TERMINATION: NodeDeathInfo.Reason
    AUTOSCALER_DRAIN_PREEMPTED: NodeDeathInfo.Reason
    AUTOSCALER_DRAIN_IDLE: NodeDeathInfo.Reason
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: NodeDeathInfo.Reason
    reason_message: str
    def __init__(self, reason: _Optional[_Union[NodeDeathInfo.Reason, str]] = ..., reason_message: _Optional[str] = ...) -> None: ...

class NodeSnapshot(_message.Message):
    __slots__ = ("state", "idle_duration_ms", "node_activity")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNDEFINED: _ClassVar[NodeSnapshot.State]
        IDLE: _ClassVar[NodeSnapshot.State]
        ACTIVE: _ClassVar[NodeSnapshot.State]
        DRAINING: _ClassVar[NodeSnapshot.State]
    UNDEFINED: NodeSnapshot.State
    IDLE: NodeSnapshot.State
    ACTIVE: NodeSnapshot.State
    DRAINING: NodeSnapshot.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    IDLE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    state: NodeSnapshot.State
    idle_duration_ms: int
    node_activity: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Union[NodeSnapshot.State, str]] = ..., idle_duration_ms: _Optional[int] = ..., node_activity: _Optional[_Iterable[str]] = ...) -> None: ...

class GcsNodeInfo(_message.Message):
    __slots__ = ("node_id", "node_manager_address", "node_manager_port", "state", "node_manager_hostname", "resources_total", "node_name", "instance_id", "node_type_name", "start_time_ms", "end_time_ms", "is_head_node", "labels", "state_snapshot", "death_info")
    class GcsNodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ALIVE: _ClassVar[GcsNodeInfo.GcsNodeState]
        DEAD: _ClassVar[GcsNodeInfo.GcsNodeState]
    ALIVE: GcsNodeInfo.GcsNodeState
    DEAD: GcsNodeInfo.GcsNodeState
    class ResourcesTotalEntry(_message.Message):
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
    NODE_MANAGER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_MANAGER_PORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_MANAGER_HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    END_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    IS_HEAD_NODE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STATE_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DEATH_INFO_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    node_manager_address: str
    node_manager_port: int
    state: GcsNodeInfo.GcsNodeState
    node_manager_hostname: str
    resources_total: _containers.ScalarMap[str, float]
    node_name: str
    instance_id: str
    node_type_name: str
    start_time_ms: int
    end_time_ms: int
    is_head_node: bool
    labels: _containers.ScalarMap[str, str]
    state_snapshot: NodeSnapshot
    death_info: NodeDeathInfo
    def __init__(self, node_id: _Optional[bytes] = ..., node_manager_address: _Optional[str] = ..., node_manager_port: _Optional[int] = ..., state: _Optional[_Union[GcsNodeInfo.GcsNodeState, str]] = ..., node_manager_hostname: _Optional[str] = ..., resources_total: _Optional[_Mapping[str, float]] = ..., node_name: _Optional[str] = ..., instance_id: _Optional[str] = ..., node_type_name: _Optional[str] = ..., start_time_ms: _Optional[int] = ..., end_time_ms: _Optional[int] = ..., is_head_node: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., state_snapshot: _Optional[_Union[NodeSnapshot, _Mapping]] = ..., death_info: _Optional[_Union[NodeDeathInfo, _Mapping]] = ...) -> None: ...

class TotalResources(_message.Message):
    __slots__ = ("node_id", "resources_total")
    class ResourcesTotalEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    resources_total: _containers.ScalarMap[str, float]
    def __init__(self, node_id: _Optional[bytes] = ..., resources_total: _Optional[_Mapping[str, float]] = ...) -> None: ...

class AvailableResources(_message.Message):
    __slots__ = ("node_id", "resources_available")
    class ResourcesAvailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    resources_available: _containers.ScalarMap[str, float]
    def __init__(self, node_id: _Optional[bytes] = ..., resources_available: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GcsStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GetAllNodeInfoRequest(_message.Message):
    __slots__ = ("limit", "node_selectors", "state_filter")
    class NodeSelector(_message.Message):
        __slots__ = ("node_id", "node_name", "node_ip_address", "is_head_node")
        NODE_ID_FIELD_NUMBER: _ClassVar[int]
        NODE_NAME_FIELD_NUMBER: _ClassVar[int]
        NODE_IP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
        IS_HEAD_NODE_FIELD_NUMBER: _ClassVar[int]
        node_id: bytes
        node_name: str
        node_ip_address: str
        is_head_node: bool
        def __init__(self, node_id: _Optional[bytes] = ..., node_name: _Optional[str] = ..., node_ip_address: _Optional[str] = ..., is_head_node: _Optional[bool] = ...) -> None: ...
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTORS_FIELD_NUMBER: _ClassVar[int]
    STATE_FILTER_FIELD_NUMBER: _ClassVar[int]
    limit: int
    node_selectors: _containers.RepeatedCompositeFieldContainer[GetAllNodeInfoRequest.NodeSelector]
    state_filter: GcsNodeInfo.GcsNodeState
    def __init__(self, limit: _Optional[int] = ..., node_selectors: _Optional[_Iterable[_Union[GetAllNodeInfoRequest.NodeSelector, _Mapping]]] = ..., state_filter: _Optional[_Union[GcsNodeInfo.GcsNodeState, str]] = ...) -> None: ...

class GetAllNodeInfoReply(_message.Message):
    __slots__ = ("status", "node_info_list", "total", "num_filtered")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_INFO_LIST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    NUM_FILTERED_FIELD_NUMBER: _ClassVar[int]
    status: GcsStatus
    node_info_list: _containers.RepeatedCompositeFieldContainer[GcsNodeInfo]
    total: int
    num_filtered: int
    def __init__(self, status: _Optional[_Union[GcsStatus, _Mapping]] = ..., node_info_list: _Optional[_Iterable[_Union[GcsNodeInfo, _Mapping]]] = ..., total: _Optional[int] = ..., num_filtered: _Optional[int] = ...) -> None: ...

class GetAllTotalResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAllTotalResourcesReply(_message.Message):
    __slots__ = ("status", "resources_list")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_LIST_FIELD_NUMBER: _ClassVar[int]
    status: GcsStatus
    resources_list: _containers.RepeatedCompositeFieldContainer[TotalResources]
    def __init__(self, status: _Optional[_Union[GcsStatus, _Mapping]] = ..., resources_list: _Optional[_Iterable[_Union[TotalResources, _Mapping]]] = ...) -> None: ...

class GetAllAvailableResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAllAvailableResourcesReply(_message.Message):
    __slots__ = ("status", "resources_list")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_LIST_FIELD_NUMBER: _ClassVar[int]
    status: GcsStatus
    resources_list: _containers.RepeatedCompositeFieldContainer[AvailableResources]
    def __init__(self, status: _Optional[_Union[GcsStatus, _Mapping]] = ..., resources_list: _Optional[_Iterable[_Union[AvailableResources, _Mapping]]] = ...) -> None: ...

class ResizeLocalResourceInstancesRequest(_message.Message):
    __slots__ = ("resources",)
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ResizeLocalResourceInstancesReply(_message.Message):
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
