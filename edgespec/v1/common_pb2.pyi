from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "relaxation", "coupled", "ignore_eos", "min_length", "logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RELAXATION_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    relaxation: Relaxation
    coupled: bool
    ignore_eos: bool
    min_length: int
    logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., relaxation: _Optional[_Union[Relaxation, _Mapping]] = ..., coupled: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., min_length: _Optional[int] = ..., logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "top_ids", "top_logprobs")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token: int
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token: _Optional[int] = ..., logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Relaxation(_message.Message):
    __slots__ = ("method", "weight", "learned", "margin", "task")
    class Method(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LOSSLESS: _ClassVar[Relaxation.Method]
        DIVERSED: _ClassVar[Relaxation.Method]
        COSPEC: _ClassVar[Relaxation.Method]
    LOSSLESS: Relaxation.Method
    DIVERSED: Relaxation.Method
    COSPEC: Relaxation.Method
    METHOD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LEARNED_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    method: Relaxation.Method
    weight: float
    learned: bool
    margin: float
    task: str
    def __init__(self, method: _Optional[_Union[Relaxation.Method, str]] = ..., weight: _Optional[float] = ..., learned: _Optional[bool] = ..., margin: _Optional[float] = ..., task: _Optional[str] = ...) -> None: ...

class SparseDistribution(_message.Message):
    __slots__ = ("ids", "weights")
    IDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., weights: _Optional[_Iterable[float]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("host", "cpus")
    HOST_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    host: str
    cpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, host: _Optional[str] = ..., cpus: _Optional[_Iterable[int]] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("token_trees", "coupled", "relaxed", "min_tokens", "logprobs")
    TOKEN_TREES_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    RELAXED_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_trees: bool
    coupled: bool
    relaxed: bool
    min_tokens: bool
    logprobs: bool
    def __init__(self, token_trees: _Optional[bool] = ..., coupled: _Optional[bool] = ..., relaxed: _Optional[bool] = ..., min_tokens: _Optional[bool] = ..., logprobs: _Optional[bool] = ...) -> None: ...
