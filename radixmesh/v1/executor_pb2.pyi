from radixmesh.v1 import cache_pb2 as _cache_pb2
from radixmesh.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NewSequence(_message.Message):
    __slots__ = ("req_id", "token_ids", "num_prompt_tokens", "num_computed_tokens", "num_scheduled_tokens", "page_ids", "sampling", "constraint", "traceparent", "page_copy")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    PAGE_COPY_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    num_scheduled_tokens: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _inference_pb2.SamplingParams
    constraint: _inference_pb2.Constraint
    traceparent: str
    page_copy: _cache_pb2.PageCopy
    def __init__(self, req_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_prompt_tokens: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., num_scheduled_tokens: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_inference_pb2.SamplingParams, _Mapping]] = ..., constraint: _Optional[_Union[_inference_pb2.Constraint, _Mapping]] = ..., traceparent: _Optional[str] = ..., page_copy: _Optional[_Union[_cache_pb2.PageCopy, _Mapping]] = ...) -> None: ...

class RunningSequence(_message.Message):
    __slots__ = ("req_id", "appended_page_ids", "num_scheduled_tokens", "num_draft_tokens")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    APPENDED_PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    appended_page_ids: _containers.RepeatedScalarFieldContainer[int]
    num_scheduled_tokens: int
    num_draft_tokens: int
    def __init__(self, req_id: _Optional[str] = ..., appended_page_ids: _Optional[_Iterable[int]] = ..., num_scheduled_tokens: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ...) -> None: ...

class StepPlan(_message.Message):
    __slots__ = ("step_id", "new_seqs", "running_seqs", "finished_req_ids", "num_steps", "abort_req_ids", "decode_req_ids", "running_rows")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_SEQS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SEQS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    ABORT_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ROWS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_seqs: _containers.RepeatedCompositeFieldContainer[NewSequence]
    running_seqs: _containers.RepeatedCompositeFieldContainer[RunningSequence]
    finished_req_ids: _containers.RepeatedScalarFieldContainer[str]
    num_steps: int
    abort_req_ids: _containers.RepeatedScalarFieldContainer[str]
    decode_req_ids: _containers.RepeatedScalarFieldContainer[str]
    running_rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, step_id: _Optional[int] = ..., new_seqs: _Optional[_Iterable[_Union[NewSequence, _Mapping]]] = ..., running_seqs: _Optional[_Iterable[_Union[RunningSequence, _Mapping]]] = ..., finished_req_ids: _Optional[_Iterable[str]] = ..., num_steps: _Optional[int] = ..., abort_req_ids: _Optional[_Iterable[str]] = ..., decode_req_ids: _Optional[_Iterable[str]] = ..., running_rows: _Optional[_Iterable[int]] = ...) -> None: ...

class SequenceOutput(_message.Message):
    __slots__ = ("req_id", "token_id", "logprobs", "finish_reason", "matched_stop_token_id", "prompt_logprobs", "prompt_logprobs_position", "accepted_token_ids", "num_draft_tokens", "num_forced_tokens")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    token_id: int
    logprobs: _inference_pb2.PositionLogprobs
    finish_reason: str
    matched_stop_token_id: int
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_inference_pb2.PositionLogprobs]
    prompt_logprobs_position: int
    accepted_token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_draft_tokens: int
    num_forced_tokens: int
    def __init__(self, req_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprobs: _Optional[_Union[_inference_pb2.PositionLogprobs, _Mapping]] = ..., finish_reason: _Optional[str] = ..., matched_stop_token_id: _Optional[int] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_inference_pb2.PositionLogprobs, _Mapping]]] = ..., prompt_logprobs_position: _Optional[int] = ..., accepted_token_ids: _Optional[_Iterable[int]] = ..., num_draft_tokens: _Optional[int] = ..., num_forced_tokens: _Optional[int] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "outputs", "step_seconds", "health", "substep", "plain_req_ids", "plain_token_ids", "output_rows", "undrafted_steps", "next_results", "idle_gap_s")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    SUBSTEP_FIELD_NUMBER: _ClassVar[int]
    PLAIN_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ROWS_FIELD_NUMBER: _ClassVar[int]
    UNDRAFTED_STEPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_RESULTS_FIELD_NUMBER: _ClassVar[int]
    IDLE_GAP_S_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    outputs: _containers.RepeatedCompositeFieldContainer[SequenceOutput]
    step_seconds: float
    health: DeviceHealth
    substep: int
    plain_req_ids: _containers.RepeatedScalarFieldContainer[str]
    plain_token_ids: _containers.RepeatedScalarFieldContainer[int]
    output_rows: _containers.RepeatedScalarFieldContainer[int]
    undrafted_steps: int
    next_results: _containers.RepeatedCompositeFieldContainer[StepResult]
    idle_gap_s: float
    def __init__(self, step_id: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[SequenceOutput, _Mapping]]] = ..., step_seconds: _Optional[float] = ..., health: _Optional[_Union[DeviceHealth, _Mapping]] = ..., substep: _Optional[int] = ..., plain_req_ids: _Optional[_Iterable[str]] = ..., plain_token_ids: _Optional[_Iterable[int]] = ..., output_rows: _Optional[_Iterable[int]] = ..., undrafted_steps: _Optional[int] = ..., next_results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ..., idle_gap_s: _Optional[float] = ...) -> None: ...

class DeviceHealth(_message.Message):
    __slots__ = ("utilization_ratio", "memory_used_bytes", "memory_total_bytes", "temperature_celsius")
    UTILIZATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_celsius: float
    def __init__(self, utilization_ratio: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., temperature_celsius: _Optional[float] = ...) -> None: ...

class PrepareConstraintRequest(_message.Message):
    __slots__ = ("constraint",)
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    constraint: _inference_pb2.Constraint
    def __init__(self, constraint: _Optional[_Union[_inference_pb2.Constraint, _Mapping]] = ...) -> None: ...

class PrepareConstraintResponse(_message.Message):
    __slots__ = ("compile_seconds",)
    COMPILE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    compile_seconds: float
    def __init__(self, compile_seconds: _Optional[float] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("executor_id", "model", "max_model_len", "vocab_size", "num_pages", "page_size", "eos_token_ids", "device", "max_num_seqs", "max_num_batched_tokens", "architecture", "dtype", "max_draft_tokens", "max_speculative_batch_size", "max_forced_tokens")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SPECULATIVE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    model: str
    max_model_len: int
    vocab_size: int
    num_pages: int
    page_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    device: str
    max_num_seqs: int
    max_num_batched_tokens: int
    architecture: str
    dtype: str
    max_draft_tokens: int
    max_speculative_batch_size: int
    max_forced_tokens: int
    def __init__(self, executor_id: _Optional[str] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., num_pages: _Optional[int] = ..., page_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., device: _Optional[str] = ..., max_num_seqs: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., architecture: _Optional[str] = ..., dtype: _Optional[str] = ..., max_draft_tokens: _Optional[int] = ..., max_speculative_batch_size: _Optional[int] = ..., max_forced_tokens: _Optional[int] = ...) -> None: ...
