from radixmesh.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("req_id", "model", "token_ids", "sampling", "constraint", "priority", "deadline_unix_ms", "hold_id", "traceparent", "group_id", "group_size")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    model: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _inference_pb2.SamplingParams
    constraint: _inference_pb2.Constraint
    priority: _inference_pb2.Priority
    deadline_unix_ms: int
    hold_id: str
    traceparent: str
    group_id: str
    group_size: int
    def __init__(self, req_id: _Optional[str] = ..., model: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_inference_pb2.SamplingParams, _Mapping]] = ..., constraint: _Optional[_Union[_inference_pb2.Constraint, _Mapping]] = ..., priority: _Optional[_Union[_inference_pb2.Priority, str]] = ..., deadline_unix_ms: _Optional[int] = ..., hold_id: _Optional[str] = ..., traceparent: _Optional[str] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("req_id",)
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    def __init__(self, req_id: _Optional[str] = ...) -> None: ...

class ReleaseHold(_message.Message):
    __slots__ = ("hold_id",)
    HOLD_ID_FIELD_NUMBER: _ClassVar[int]
    hold_id: str
    def __init__(self, hold_id: _Optional[str] = ...) -> None: ...

class SubmitBatch(_message.Message):
    __slots__ = ("submits",)
    SUBMITS_FIELD_NUMBER: _ClassVar[int]
    submits: _containers.RepeatedCompositeFieldContainer[SubmitRequest]
    def __init__(self, submits: _Optional[_Iterable[_Union[SubmitRequest, _Mapping]]] = ...) -> None: ...

class ReleaseHolds(_message.Message):
    __slots__ = ("hold_ids",)
    HOLD_IDS_FIELD_NUMBER: _ClassVar[int]
    hold_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, hold_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("submit", "abort", "release_hold", "submit_batch", "release_holds")
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_HOLD_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_BATCH_FIELD_NUMBER: _ClassVar[int]
    RELEASE_HOLDS_FIELD_NUMBER: _ClassVar[int]
    submit: SubmitRequest
    abort: AbortRequest
    release_hold: ReleaseHold
    submit_batch: SubmitBatch
    release_holds: ReleaseHolds
    def __init__(self, submit: _Optional[_Union[SubmitRequest, _Mapping]] = ..., abort: _Optional[_Union[AbortRequest, _Mapping]] = ..., release_hold: _Optional[_Union[ReleaseHold, _Mapping]] = ..., submit_batch: _Optional[_Union[SubmitBatch, _Mapping]] = ..., release_holds: _Optional[_Union[ReleaseHolds, _Mapping]] = ...) -> None: ...

class TokenUpdate(_message.Message):
    __slots__ = ("req_id", "token_ids", "logprobs", "finish_reason", "matched_stop_token_id", "num_prompt_tokens", "num_cached_tokens", "error_code", "error_message", "prompt_logprobs", "speculation")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_inference_pb2.PositionLogprobs]
    finish_reason: str
    matched_stop_token_id: int
    num_prompt_tokens: int
    num_cached_tokens: int
    error_code: int
    error_message: str
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_inference_pb2.PositionLogprobs]
    speculation: _inference_pb2.SpeculationUsage
    def __init__(self, req_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_inference_pb2.PositionLogprobs, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., matched_stop_token_id: _Optional[int] = ..., num_prompt_tokens: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_inference_pb2.PositionLogprobs, _Mapping]]] = ..., speculation: _Optional[_Union[_inference_pb2.SpeculationUsage, _Mapping]] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("step_id", "updates")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    updates: _containers.RepeatedCompositeFieldContainer[TokenUpdate]
    def __init__(self, step_id: _Optional[int] = ..., updates: _Optional[_Iterable[_Union[TokenUpdate, _Mapping]]] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecutorLoad(_message.Message):
    __slots__ = ("executor_id", "model", "num_running", "num_waiting", "kv_usage", "healthy")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    model: str
    num_running: int
    num_waiting: int
    kv_usage: float
    healthy: bool
    def __init__(self, executor_id: _Optional[str] = ..., model: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., healthy: _Optional[bool] = ...) -> None: ...

class ModelCapacity(_message.Message):
    __slots__ = ("model", "requests_per_s", "headroom", "max_model_len")
    class HeadroomEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    model: str
    requests_per_s: float
    headroom: _containers.ScalarMap[str, int]
    max_model_len: int
    def __init__(self, model: _Optional[str] = ..., requests_per_s: _Optional[float] = ..., headroom: _Optional[_Mapping[str, int]] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("executors", "num_waiting", "capacity")
    class NumWaitingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    executors: _containers.RepeatedCompositeFieldContainer[ExecutorLoad]
    num_waiting: _containers.ScalarMap[str, int]
    capacity: _containers.RepeatedCompositeFieldContainer[ModelCapacity]
    def __init__(self, executors: _Optional[_Iterable[_Union[ExecutorLoad, _Mapping]]] = ..., num_waiting: _Optional[_Mapping[str, int]] = ..., capacity: _Optional[_Iterable[_Union[ModelCapacity, _Mapping]]] = ...) -> None: ...
