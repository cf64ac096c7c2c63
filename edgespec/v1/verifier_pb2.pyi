from edgespec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model", "vocab_size", "eos_token_ids", "max_window", "max_session_tokens", "device", "dtype", "forward_seconds", "placement", "capabilities", "far_positions", "far_forward_seconds")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    FAR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    FAR_FORWARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_window: int
    max_session_tokens: int
    device: str
    dtype: str
    forward_seconds: _containers.RepeatedScalarFieldContainer[float]
    placement: _common_pb2.Placement
    capabilities: _common_pb2.Capabilities
    far_positions: int
    far_forward_seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., max_window: _Optional[int] = ..., max_session_tokens: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., forward_seconds: _Optional[_Iterable[float]] = ..., placement: _Optional[_Union[_common_pb2.Placement, _Mapping]] = ..., capabilities: _Optional[_Union[_common_pb2.Capabilities, _Mapping]] = ..., far_positions: _Optional[int] = ..., far_forward_seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "tokens", "sampling")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    def __init__(self, session_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("committed_position", "prefill_seconds")
    COMMITTED_POSITION_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    committed_position: int
    prefill_seconds: float
    def __init__(self, committed_position: _Optional[int] = ..., prefill_seconds: _Optional[float] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("session_id", "window_seq", "base_position", "draft_tokens", "params_fingerprint", "draft_probs", "optimistic", "parent_token", "trace_context", "draft_parents", "self_draft", "steps")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_POSITION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    OPTIMISTIC_FIELD_NUMBER: _ClassVar[int]
    PARENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PARENTS_FIELD_NUMBER: _ClassVar[int]
    SELF_DRAFT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    window_seq: int
    base_position: int
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    params_fingerprint: int
    draft_probs: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseDistribution]
    optimistic: bool
    parent_token: int
    trace_context: _containers.ScalarMap[str, str]
    draft_parents: _containers.RepeatedScalarFieldContainer[int]
    self_draft: int
    steps: int
    def __init__(self, session_id: _Optional[str] = ..., window_seq: _Optional[int] = ..., base_position: _Optional[int] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., params_fingerprint: _Optional[int] = ..., draft_probs: _Optional[_Iterable[_Union[_common_pb2.SparseDistribution, _Mapping]]] = ..., optimistic: _Optional[bool] = ..., parent_token: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., draft_parents: _Optional[_Iterable[int]] = ..., self_draft: _Optional[int] = ..., steps: _Optional[int] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("session_id", "window_seq", "base_position", "accepted", "next_token", "committed_position", "verify_compute_seconds", "queue_depth", "discarded", "target_logprob", "batch_windows", "batch_tokens", "accepted_nodes", "drafted_tokens", "self_drafted", "logprobs", "verifier_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_POSITION_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    TARGET_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BATCH_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_NODES_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SELF_DRAFTED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    window_seq: int
    base_position: int
    accepted: int
    next_token: int
    committed_position: int
    verify_compute_seconds: float
    queue_depth: int
    discarded: bool
    target_logprob: float
    batch_windows: int
    batch_tokens: int
    accepted_nodes: _containers.RepeatedScalarFieldContainer[int]
    drafted_tokens: _containers.RepeatedScalarFieldContainer[int]
    self_drafted: int
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    verifier_seconds: float
    def __init__(self, session_id: _Optional[str] = ..., window_seq: _Optional[int] = ..., base_position: _Optional[int] = ..., accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., committed_position: _Optional[int] = ..., verify_compute_seconds: _Optional[float] = ..., queue_depth: _Optional[int] = ..., discarded: _Optional[bool] = ..., target_logprob: _Optional[float] = ..., batch_windows: _Optional[int] = ..., batch_tokens: _Optional[int] = ..., accepted_nodes: _Optional[_Iterable[int]] = ..., drafted_tokens: _Optional[_Iterable[int]] = ..., self_drafted: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., verifier_seconds: _Optional[float] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
