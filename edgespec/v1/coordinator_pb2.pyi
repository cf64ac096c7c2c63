from edgespec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "max_new_tokens", "window", "chat", "sampling", "resume_token_ids", "messages", "stop", "min_tokens")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    max_new_tokens: int
    window: int
    chat: bool
    sampling: _common_pb2.SamplingParams
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    stop: _containers.RepeatedScalarFieldContainer[str]
    min_tokens: int
    def __init__(self, prompt: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., window: _Optional[int] = ..., chat: _Optional[bool] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., stop: _Optional[_Iterable[str]] = ..., min_tokens: _Optional[int] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("chunk", "stats", "plan")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    chunk: TokenChunk
    stats: GenerationStats
    plan: SpeculationPlan
    def __init__(self, chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ..., plan: _Optional[_Union[SpeculationPlan, _Mapping]] = ...) -> None: ...

class SpeculationPlan(_message.Message):
    __slots__ = ("window", "auto_policy", "auto_max_window", "max_window", "pipeline", "tree_depth", "cloud_draft", "free_drafts", "target_steps", "on_verifier_loss", "max_unverified", "notes", "first_token_alone")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    AUTO_POLICY_FIELD_NUMBER: _ClassVar[int]
    AUTO_MAX_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    TREE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    CLOUD_DRAFT_FIELD_NUMBER: _ClassVar[int]
    FREE_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    TARGET_STEPS_FIELD_NUMBER: _ClassVar[int]
    ON_VERIFIER_LOSS_FIELD_NUMBER: _ClassVar[int]
    MAX_UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ALONE_FIELD_NUMBER: _ClassVar[int]
    window: int
    auto_policy: str
    auto_max_window: int
    max_window: int
    pipeline: bool
    tree_depth: int
    cloud_draft: str
    free_drafts: bool
    target_steps: int
    on_verifier_loss: str
    max_unverified: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    first_token_alone: bool
    def __init__(self, window: _Optional[int] = ..., auto_policy: _Optional[str] = ..., auto_max_window: _Optional[int] = ..., max_window: _Optional[int] = ..., pipeline: _Optional[bool] = ..., tree_depth: _Optional[int] = ..., cloud_draft: _Optional[str] = ..., free_drafts: _Optional[bool] = ..., target_steps: _Optional[int] = ..., on_verifier_loss: _Optional[str] = ..., max_unverified: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., first_token_alone: _Optional[bool] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("token_ids", "text", "generated", "position", "unverified", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    generated: int
    position: int
    unverified: bool
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., generated: _Optional[int] = ..., position: _Optional[int] = ..., unverified: _Optional[bool] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("prompt_tokens", "new_tokens", "rounds", "drafted_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length", "seconds", "tokens_per_second", "draft_seconds", "verify_wall_seconds", "finish_reason", "verifier", "prefill_seconds", "seed", "verification", "failovers", "recovery_seconds", "unverified_tokens", "pipelined", "optimistic_windows", "optimistic_hits", "target_logprob", "lossy", "drafter", "stop_sequence", "offered_at_depth", "accepted_at_depth", "free_rounds", "free_drafted_tokens", "free_accepted_tokens", "free_declined")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PIPELINED_FIELD_NUMBER: _ClassVar[int]
    OPTIMISTIC_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    OPTIMISTIC_HITS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    LOSSY_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OFFERED_AT_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_DEPTH_FIELD_NUMBER: _ClassVar[int]
    FREE_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    FREE_DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_DECLINED_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    new_tokens: int
    rounds: int
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_accepted_length: float
    seconds: float
    tokens_per_second: float
    draft_seconds: float
    verify_wall_seconds: float
    finish_reason: str
    verifier: str
    prefill_seconds: float
    seed: int
    verification: str
    failovers: int
    recovery_seconds: float
    unverified_tokens: int
    pipelined: bool
    optimistic_windows: int
    optimistic_hits: int
    target_logprob: float
    lossy: bool
    drafter: str
    stop_sequence: str
    offered_at_depth: _containers.RepeatedScalarFieldContainer[int]
    accepted_at_depth: _containers.RepeatedScalarFieldContainer[int]
    free_rounds: int
    free_drafted_tokens: int
    free_accepted_tokens: int
    free_declined: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., new_tokens: _Optional[int] = ..., rounds: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., mean_accepted_length: _Optional[float] = ..., seconds: _Optional[float] = ..., tokens_per_second: _Optional[float] = ..., draft_seconds: _Optional[float] = ..., verify_wall_seconds: _Optional[float] = ..., finish_reason: _Optional[str] = ..., verifier: _Optional[str] = ..., prefill_seconds: _Optional[float] = ..., seed: _Optional[int] = ..., verification: _Optional[str] = ..., failovers: _Optional[int] = ..., recovery_seconds: _Optional[float] = ..., unverified_tokens: _Optional[int] = ..., pipelined: _Optional[bool] = ..., optimistic_windows: _Optional[int] = ..., optimistic_hits: _Optional[int] = ..., target_logprob: _Optional[float] = ..., lossy: _Optional[bool] = ..., drafter: _Optional[str] = ..., stop_sequence: _Optional[str] = ..., offered_at_depth: _Optional[_Iterable[int]] = ..., accepted_at_depth: _Optional[_Iterable[int]] = ..., free_rounds: _Optional[int] = ..., free_drafted_tokens: _Optional[int] = ..., free_accepted_tokens: _Optional[int] = ..., free_declined: _Optional[int] = ...) -> None: ...
