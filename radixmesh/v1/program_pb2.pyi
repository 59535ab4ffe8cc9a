from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from radixmesh.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolePart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_PART_WHOLE: _ClassVar[RolePart]
    ROLE_PART_BEGIN: _ClassVar[RolePart]
    ROLE_PART_END: _ClassVar[RolePart]

class SelectMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SELECT_METHOD_TOKEN_LENGTH_NORMALIZED: _ClassVar[SelectMethod]
    SELECT_METHOD_GREEDY_TOKEN: _ClassVar[SelectMethod]
    SELECT_METHOD_UNCONDITIONAL_LIKELIHOOD_NORMALIZED: _ClassVar[SelectMethod]

class OnError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ON_ERROR_FAIL: _ClassVar[OnError]
    ON_ERROR_FALLBACK: _ClassVar[OnError]

class BranchPrediction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BRANCH_PREDICTION_NONE: _ClassVar[BranchPrediction]
    BRANCH_PREDICTION_HIT: _ClassVar[BranchPrediction]
    BRANCH_PREDICTION_MISS: _ClassVar[BranchPrediction]
ROLE_PART_WHOLE: RolePart
ROLE_PART_BEGIN: RolePart
ROLE_PART_END: RolePart
SELECT_METHOD_TOKEN_LENGTH_NORMALIZED: SelectMethod
SELECT_METHOD_GREEDY_TOKEN: SelectMethod
SELECT_METHOD_UNCONDITIONAL_LIKELIHOOD_NORMALIZED: SelectMethod
ON_ERROR_FAIL: OnError
ON_ERROR_FALLBACK: OnError
BRANCH_PREDICTION_NONE: BranchPrediction
BRANCH_PREDICTION_HIT: BranchPrediction
BRANCH_PREDICTION_MISS: BranchPrediction

class RunProgramRequest(_message.Message):
    __slots__ = ("program", "inputs", "request_id", "priority")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    program: Program
    inputs: _containers.ScalarMap[str, str]
    request_id: str
    priority: _inference_pb2.Priority
    def __init__(self, program: _Optional[_Union[Program, _Mapping]] = ..., inputs: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[_inference_pb2.Priority, str]] = ...) -> None: ...

class Program(_message.Message):
    __slots__ = ("name", "model", "body", "limits")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    body: _containers.RepeatedCompositeFieldContainer[Statement]
    limits: Limits
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., body: _Optional[_Iterable[_Union[Statement, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_statements", "max_fork_width", "max_depth", "max_total_tokens", "max_wall_time_ms")
    MAX_STATEMENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_FORK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_WALL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    max_statements: int
    max_fork_width: int
    max_depth: int
    max_total_tokens: int
    max_wall_time_ms: int
    def __init__(self, max_statements: _Optional[int] = ..., max_fork_width: _Optional[int] = ..., max_depth: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_wall_time_ms: _Optional[int] = ...) -> None: ...

class Statement(_message.Message):
    __slots__ = ("append", "gen", "select", "fork", "branch", "call", "result")
    APPEND_FIELD_NUMBER: _ClassVar[int]
    GEN_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    append: Append
    gen: Gen
    select: Select
    fork: Fork
    branch: If
    call: Call
    result: Return
    def __init__(self, append: _Optional[_Union[Append, _Mapping]] = ..., gen: _Optional[_Union[Gen, _Mapping]] = ..., select: _Optional[_Union[Select, _Mapping]] = ..., fork: _Optional[_Union[Fork, _Mapping]] = ..., branch: _Optional[_Union[If, _Mapping]] = ..., call: _Optional[_Union[Call, _Mapping]] = ..., result: _Optional[_Union[Return, _Mapping]] = ...) -> None: ...

class Append(_message.Message):
    __slots__ = ("text", "template", "role", "part")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    text: str
    template: str
    role: str
    part: RolePart
    def __init__(self, text: _Optional[str] = ..., template: _Optional[str] = ..., role: _Optional[str] = ..., part: _Optional[_Union[RolePart, str]] = ...) -> None: ...

class Gen(_message.Message):
    __slots__ = ("var", "sampling", "constraint", "model")
    VAR_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    var: str
    sampling: _inference_pb2.SamplingParams
    constraint: _inference_pb2.Constraint
    model: str
    def __init__(self, var: _Optional[str] = ..., sampling: _Optional[_Union[_inference_pb2.SamplingParams, _Mapping]] = ..., constraint: _Optional[_Union[_inference_pb2.Constraint, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class Select(_message.Message):
    __slots__ = ("var", "choices", "method", "model")
    VAR_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    var: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    method: SelectMethod
    model: str
    def __init__(self, var: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., method: _Optional[_Union[SelectMethod, str]] = ..., model: _Optional[str] = ...) -> None: ...

class Body(_message.Message):
    __slots__ = ("body",)
    BODY_FIELD_NUMBER: _ClassVar[int]
    body: _containers.RepeatedCompositeFieldContainer[Statement]
    def __init__(self, body: _Optional[_Iterable[_Union[Statement, _Mapping]]] = ...) -> None: ...

class Fork(_message.Message):
    __slots__ = ("branches", "each", "copies", "index_var")
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    EACH_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    INDEX_VAR_FIELD_NUMBER: _ClassVar[int]
    branches: _containers.RepeatedCompositeFieldContainer[Body]
    each: Body
    copies: int
    index_var: str
    def __init__(self, branches: _Optional[_Iterable[_Union[Body, _Mapping]]] = ..., each: _Optional[_Union[Body, _Mapping]] = ..., copies: _Optional[int] = ..., index_var: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("contains", "equals", "regex", "negate")
    CONTAINS_FIELD_NUMBER: _ClassVar[int]
    EQUALS_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    NEGATE_FIELD_NUMBER: _ClassVar[int]
    contains: VarValue
    equals: VarValue
    regex: VarValue
    negate: bool
    def __init__(self, contains: _Optional[_Union[VarValue, _Mapping]] = ..., equals: _Optional[_Union[VarValue, _Mapping]] = ..., regex: _Optional[_Union[VarValue, _Mapping]] = ..., negate: _Optional[bool] = ...) -> None: ...

class VarValue(_message.Message):
    __slots__ = ("var", "value")
    VAR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    var: str
    value: str
    def __init__(self, var: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class If(_message.Message):
    __slots__ = ("condition", "then", "otherwise")
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    THEN_FIELD_NUMBER: _ClassVar[int]
    OTHERWISE_FIELD_NUMBER: _ClassVar[int]
    condition: Condition
    then: _containers.RepeatedCompositeFieldContainer[Statement]
    otherwise: _containers.RepeatedCompositeFieldContainer[Statement]
    def __init__(self, condition: _Optional[_Union[Condition, _Mapping]] = ..., then: _Optional[_Iterable[_Union[Statement, _Mapping]]] = ..., otherwise: _Optional[_Iterable[_Union[Statement, _Mapping]]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("tool", "args", "json_args", "var", "timeout_ms", "on_error", "fallback")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    JSON_ARGS_FIELD_NUMBER: _ClassVar[int]
    VAR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    tool: str
    args: _containers.ScalarMap[str, str]
    json_args: _struct_pb2.Struct
    var: str
    timeout_ms: int
    on_error: OnError
    fallback: str
    def __init__(self, tool: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ..., json_args: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., var: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., on_error: _Optional[_Union[OnError, str]] = ..., fallback: _Optional[str] = ...) -> None: ...

class Return(_message.Message):
    __slots__ = ("var", "template", "output_schema")
    VAR_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    var: str
    template: str
    output_schema: str
    def __init__(self, var: _Optional[str] = ..., template: _Optional[str] = ..., output_schema: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("start", "statement")
    START_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    start: SessionStart
    statement: Statement
    def __init__(self, start: _Optional[_Union[SessionStart, _Mapping]] = ..., statement: _Optional[_Union[Statement, _Mapping]] = ...) -> None: ...

class SessionStart(_message.Message):
    __slots__ = ("name", "model", "limits", "inputs", "priority")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    limits: Limits
    inputs: _containers.ScalarMap[str, str]
    priority: _inference_pb2.Priority
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., inputs: _Optional[_Mapping[str, str]] = ..., priority: _Optional[_Union[_inference_pb2.Priority, str]] = ...) -> None: ...

class ProgramEvent(_message.Message):
    __slots__ = ("statement", "text", "var_set", "branch", "tool_started", "tool_finished", "select", "error", "result", "done")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VAR_SET_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    TOOL_STARTED_FIELD_NUMBER: _ClassVar[int]
    TOOL_FINISHED_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    statement: str
    text: TextDelta
    var_set: VarSet
    branch: BranchTaken
    tool_started: ToolStarted
    tool_finished: ToolFinished
    select: SelectScores
    error: ProgramError
    result: ProgramResult
    done: StatementDone
    def __init__(self, statement: _Optional[str] = ..., text: _Optional[_Union[TextDelta, _Mapping]] = ..., var_set: _Optional[_Union[VarSet, _Mapping]] = ..., branch: _Optional[_Union[BranchTaken, _Mapping]] = ..., tool_started: _Optional[_Union[ToolStarted, _Mapping]] = ..., tool_finished: _Optional[_Union[ToolFinished, _Mapping]] = ..., select: _Optional[_Union[SelectScores, _Mapping]] = ..., error: _Optional[_Union[ProgramError, _Mapping]] = ..., result: _Optional[_Union[ProgramResult, _Mapping]] = ..., done: _Optional[_Union[StatementDone, _Mapping]] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("var", "text")
    VAR_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    var: str
    text: str
    def __init__(self, var: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class VarSet(_message.Message):
    __slots__ = ("var", "value_json")
    VAR_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    var: str
    value_json: str
    def __init__(self, var: _Optional[str] = ..., value_json: _Optional[str] = ...) -> None: ...

class BranchTaken(_message.Message):
    __slots__ = ("then", "prediction")
    THEN_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    then: bool
    prediction: BranchPrediction
    def __init__(self, then: _Optional[bool] = ..., prediction: _Optional[_Union[BranchPrediction, str]] = ...) -> None: ...

class ToolStarted(_message.Message):
    __slots__ = ("tool", "args_json")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    tool: str
    args_json: str
    def __init__(self, tool: _Optional[str] = ..., args_json: _Optional[str] = ...) -> None: ...

class ToolFinished(_message.Message):
    __slots__ = ("tool", "cached", "error", "duration_ms")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    tool: str
    cached: bool
    error: str
    duration_ms: int
    def __init__(self, tool: _Optional[str] = ..., cached: _Optional[bool] = ..., error: _Optional[str] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class ChoiceScore(_message.Message):
    __slots__ = ("choice", "score", "logprob_sum", "num_tokens", "tokens")
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_SUM_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    choice: str
    score: float
    logprob_sum: float
    num_tokens: int
    tokens: _containers.RepeatedCompositeFieldContainer[_inference_pb2.TokenLogprob]
    def __init__(self, choice: _Optional[str] = ..., score: _Optional[float] = ..., logprob_sum: _Optional[float] = ..., num_tokens: _Optional[int] = ..., tokens: _Optional[_Iterable[_Union[_inference_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class SelectScores(_message.Message):
    __slots__ = ("var", "scores")
    VAR_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    var: str
    scores: _containers.RepeatedCompositeFieldContainer[ChoiceScore]
    def __init__(self, var: _Optional[str] = ..., scores: _Optional[_Iterable[_Union[ChoiceScore, _Mapping]]] = ...) -> None: ...

class ProgramError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class StatementUsage(_message.Message):
    __slots__ = ("statement", "model", "usage")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    statement: str
    model: str
    usage: _inference_pb2.Usage
    def __init__(self, statement: _Optional[str] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[_inference_pb2.Usage, _Mapping]] = ...) -> None: ...

class ProgramResult(_message.Message):
    __slots__ = ("value_json", "vars_json", "usage", "total")
    class VarsJsonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    VARS_JSON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    value_json: str
    vars_json: _containers.ScalarMap[str, str]
    usage: _containers.RepeatedCompositeFieldContainer[StatementUsage]
    total: _inference_pb2.Usage
    def __init__(self, value_json: _Optional[str] = ..., vars_json: _Optional[_Mapping[str, str]] = ..., usage: _Optional[_Iterable[_Union[StatementUsage, _Mapping]]] = ..., total: _Optional[_Union[_inference_pb2.Usage, _Mapping]] = ...) -> None: ...

class StatementDone(_message.Message):
    __slots__ = ("vars_json", "returned")
    class VarsJsonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VARS_JSON_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    vars_json: _containers.ScalarMap[str, str]
    returned: bool
    def __init__(self, vars_json: _Optional[_Mapping[str, str]] = ..., returned: _Optional[bool] = ...) -> None: ...
