from edgespec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DrafterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrafterInfoResponse(_message.Message):
    __slots__ = ("model", "vocab_size", "max_window", "backend", "device", "dtype", "eos_token_ids", "draft_seconds_per_token", "prefill_seconds_per_token", "placement", "capabilities")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_WINDOW_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SECONDS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    max_window: int
    backend: str
    device: str
    dtype: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_seconds_per_token: float
    prefill_seconds_per_token: float
    placement: _common_pb2.Placement
    capabilities: _common_pb2.Capabilities
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_window: _Optional[int] = ..., backend: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., draft_seconds_per_token: _Optional[float] = ..., prefill_seconds_per_token: _Optional[float] = ..., placement: _Optional[_Union[_common_pb2.Placement, _Mapping]] = ..., capabilities: _Optional[_Union[_common_pb2.Capabilities, _Mapping]] = ...) -> None: ...

class DrafterOpenRequest(_message.Message):
    __slots__ = ("session_id", "tokens", "sampling", "q_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    Q_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    q_ids: int
    def __init__(self, session_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., q_ids: _Optional[int] = ...) -> None: ...

class DrafterOpenResponse(_message.Message):
    __slots__ = ("committed_position",)
    COMMITTED_POSITION_FIELD_NUMBER: _ClassVar[int]
    committed_position: int
    def __init__(self, committed_position: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("session_id", "base_position", "append", "k", "tree_depth")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_POSITION_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    TREE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    base_position: int
    append: _containers.RepeatedScalarFieldContainer[int]
    k: int
    tree_depth: int
    def __init__(self, session_id: _Optional[str] = ..., base_position: _Optional[int] = ..., append: _Optional[_Iterable[int]] = ..., k: _Optional[int] = ..., tree_depth: _Optional[int] = ...) -> None: ...

class DraftResponse(_message.Message):
    __slots__ = ("tokens", "draft_seconds", "probs", "parents")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_seconds: float
    probs: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseDistribution]
    parents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., draft_seconds: _Optional[float] = ..., probs: _Optional[_Iterable[_Union[_common_pb2.SparseDistribution, _Mapping]]] = ..., parents: _Optional[_Iterable[int]] = ...) -> None: ...

class CropRequest(_message.Message):
    __slots__ = ("session_id", "position")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    position: int
    def __init__(self, session_id: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class CropResponse(_message.Message):
    __slots__ = ("committed_position",)
    COMMITTED_POSITION_FIELD_NUMBER: _ClassVar[int]
    committed_position: int
    def __init__(self, committed_position: _Optional[int] = ...) -> None: ...

class DrafterCloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DrafterCloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
