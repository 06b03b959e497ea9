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

class GcsNodeInfo(_message.Message):
    __slots__ = ("node_id", "node_manager_address", "node_manager_port", "state", "instance_id", "node_type_name", "start_time_ms", "end_time_ms", "is_head_node", "labels", "death_info")
    class GcsNodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ALIVE: _ClassVar[GcsNodeInfo.GcsNodeState]
        DEAD: _ClassVar[GcsNodeInfo.GcsNodeState]
    ALIVE: GcsNodeInfo.GcsNodeState
    DEAD: GcsNodeInfo.GcsNodeState
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
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_NAME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    END_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    IS_HEAD_NODE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DEATH_INFO_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    node_manager_address: str
    node_manager_port: int
    state: GcsNodeInfo.GcsNodeState
    instance_id: str
    node_type_name: str
    start_time_ms: int
    end_time_ms: int
    is_head_node: bool
    labels: _containers.ScalarMap[str, str]
    death_info: NodeDeathInfo
    def __init__(self, node_id: _Optional[bytes] = ..., node_manager_address: _Optional[str] = ..., node_manager_port: _Optional[int] = ..., state: _Optional[_Union[GcsNodeInfo.GcsNodeState, str]] = ..., instance_id: _Optional[str] = ..., node_type_name: _Optional[str] = ..., start_time_ms: _Optional[int] = ..., end_time_ms: _Optional[int] = ..., is_head_node: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., death_info: _Optional[_Union[NodeDeathInfo, _Mapping]] = ...) -> None: ...

class GcsStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GetAllNodeInfoRequest(_message.Message):
    __slots__ = ("state_filter",)
    STATE_FILTER_FIELD_NUMBER: _ClassVar[int]
    state_filter: GcsNodeInfo.GcsNodeState
    def __init__(self, state_filter: _Optional[_Union[GcsNodeInfo.GcsNodeState, str]] = ...) -> None: ...

class GetAllNodeInfoReply(_message.Message):
    __slots__ = ("status", "node_info_list")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_INFO_LIST_FIELD_NUMBER: _ClassVar[int]
    status: GcsStatus
    node_info_list: _containers.RepeatedCompositeFieldContainer[GcsNodeInfo]
    def __init__(self, status: _Optional[_Union[GcsStatus, _Mapping]] = ..., node_info_list: _Optional[_Iterable[_Union[GcsNodeInfo, _Mapping]]] = ...) -> None: ...

class InternalKVGetRequest(_message.Message):
    __slots__ = ("key", "namespace")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    namespace: bytes
    def __init__(self, key: _Optional[bytes] = ..., namespace: _Optional[bytes] = ...) -> None: ...

class InternalKVGetReply(_message.Message):
    __slots__ = ("status", "value")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    status: GcsStatus
    value: bytes
    def __init__(self, status: _Optional[_Union[GcsStatus, _Mapping]] = ..., value: _Optional[bytes] = ...) -> None: ...
