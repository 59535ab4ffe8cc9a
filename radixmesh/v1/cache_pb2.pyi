from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterPoolRequest(_message.Message):
    __slots__ = ("executor_id", "model", "num_pages", "page_size")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    model: str
    num_pages: int
    page_size: int
    def __init__(self, executor_id: _Optional[str] = ..., model: _Optional[str] = ..., num_pages: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class RegisterPoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterPoolRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class UnregisterPoolResponse(_message.Message):
    __slots__ = ("num_leases_dropped",)
    NUM_LEASES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    num_leases_dropped: int
    def __init__(self, num_leases_dropped: _Optional[int] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("token_ids", "model")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    model: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ...) -> None: ...

class PoolMatch(_message.Message):
    __slots__ = ("executor_id", "num_cached_tokens")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    num_cached_tokens: int
    def __init__(self, executor_id: _Optional[str] = ..., num_cached_tokens: _Optional[int] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("matches",)
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[PoolMatch]
    def __init__(self, matches: _Optional[_Iterable[_Union[PoolMatch, _Mapping]]] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("executor_id", "token_ids", "num_tokens", "holder")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    holder: str
    def __init__(self, executor_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ..., holder: _Optional[str] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease_id", "num_cached_tokens", "page_ids", "page_copy")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    PAGE_COPY_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    num_cached_tokens: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    page_copy: PageCopy
    def __init__(self, lease_id: _Optional[str] = ..., num_cached_tokens: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ..., page_copy: _Optional[_Union[PageCopy, _Mapping]] = ...) -> None: ...

class PageCopy(_message.Message):
    __slots__ = ("src_page_id", "dst_page_id", "num_tokens")
    SRC_PAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DST_PAGE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    src_page_id: int
    dst_page_id: int
    num_tokens: int
    def __init__(self, src_page_id: _Optional[int] = ..., dst_page_id: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ExtendRequest(_message.Message):
    __slots__ = ("lease_id", "num_pages")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    num_pages: int
    def __init__(self, lease_id: _Optional[str] = ..., num_pages: _Optional[int] = ...) -> None: ...

class ExtendResponse(_message.Message):
    __slots__ = ("page_ids",)
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, page_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("lease_id", "token_ids", "keep_locked")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    KEEP_LOCKED_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    keep_locked: bool
    def __init__(self, lease_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., keep_locked: _Optional[bool] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("num_cached_tokens", "num_locked_pages")
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOCKED_PAGES_FIELD_NUMBER: _ClassVar[int]
    num_cached_tokens: int
    num_locked_pages: int
    def __init__(self, num_cached_tokens: _Optional[int] = ..., num_locked_pages: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("holder",)
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    holder: str
    def __init__(self, holder: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("num_leases",)
    NUM_LEASES_FIELD_NUMBER: _ClassVar[int]
    num_leases: int
    def __init__(self, num_leases: _Optional[int] = ...) -> None: ...

class CacheOp(_message.Message):
    __slots__ = ("op_id", "acquire", "extend", "commit", "release", "match", "heartbeat", "traceparent")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    op_id: int
    acquire: AcquireRequest
    extend: ExtendRequest
    commit: CommitRequest
    release: ReleaseRequest
    match: MatchRequest
    heartbeat: HeartbeatRequest
    traceparent: str
    def __init__(self, op_id: _Optional[int] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., extend: _Optional[_Union[ExtendRequest, _Mapping]] = ..., commit: _Optional[_Union[CommitRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., match: _Optional[_Union[MatchRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class CacheOps(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[CacheOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[CacheOp, _Mapping]]] = ...) -> None: ...

class CacheOpResults(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CacheOpResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CacheOpResult, _Mapping]]] = ...) -> None: ...

class CacheOpResult(_message.Message):
    __slots__ = ("op_id", "error_code", "error_message", "acquire", "extend", "commit", "release", "match", "heartbeat")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    op_id: int
    error_code: int
    error_message: str
    acquire: AcquireResponse
    extend: ExtendResponse
    commit: CommitResponse
    release: ReleaseResponse
    match: MatchResponse
    heartbeat: HeartbeatResponse
    def __init__(self, op_id: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., acquire: _Optional[_Union[AcquireResponse, _Mapping]] = ..., extend: _Optional[_Union[ExtendResponse, _Mapping]] = ..., commit: _Optional[_Union[CommitResponse, _Mapping]] = ..., release: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., match: _Optional[_Union[MatchResponse, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatResponse, _Mapping]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("executor_id", "model", "num_pages", "page_size", "num_free_pages", "num_leased_pages", "num_cached_pages", "num_locked_pages", "num_leases", "num_prefix_queries", "num_prefix_hit_tokens", "num_query_tokens", "num_evicted_pages")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_LEASED_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_LOCKED_PAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_LEASES_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_QUERIES_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_EVICTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    model: str
    num_pages: int
    page_size: int
    num_free_pages: int
    num_leased_pages: int
    num_cached_pages: int
    num_locked_pages: int
    num_leases: int
    num_prefix_queries: int
    num_prefix_hit_tokens: int
    num_query_tokens: int
    num_evicted_pages: int
    def __init__(self, executor_id: _Optional[str] = ..., model: _Optional[str] = ..., num_pages: _Optional[int] = ..., page_size: _Optional[int] = ..., num_free_pages: _Optional[int] = ..., num_leased_pages: _Optional[int] = ..., num_cached_pages: _Optional[int] = ..., num_locked_pages: _Optional[int] = ..., num_leases: _Optional[int] = ..., num_prefix_queries: _Optional[int] = ..., num_prefix_hit_tokens: _Optional[int] = ..., num_query_tokens: _Optional[int] = ..., num_evicted_pages: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStats]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolStats, _Mapping]]] = ...) -> None: ...

class GetContinuationRequest(_message.Message):
    __slots__ = ("token_ids", "model", "max_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    model: str
    max_tokens: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class GetContinuationResponse(_message.Message):
    __slots__ = ("executor_id", "num_matched_tokens", "token_ids")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    num_matched_tokens: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, executor_id: _Optional[str] = ..., num_matched_tokens: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetResultRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class GetResultResponse(_message.Message):
    __slots__ = ("found", "value")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class PutResultRequest(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class PutResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("found", "token_ids")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    found: bool
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, found: _Optional[bool] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PutSessionRequest(_message.Message):
    __slots__ = ("session_id", "token_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PutSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
