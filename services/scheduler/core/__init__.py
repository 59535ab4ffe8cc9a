"""The scheduler core: no gRPC, talks to the cache and executors through ports."""

from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.executor_state import ExecutorLoad
from services.scheduler.core.ports import CachePort, ExecutorInfo, ExecutorPort, LeaseGrant
from services.scheduler.core.request import (
    Priority,
    Request,
    RequestStatus,
    RequestUpdate,
    StepUpdates,
)
from services.scheduler.core.scheduler import SchedulerCore, UpdateSink

__all__ = [
    "CachePort",
    "ExecutorInfo",
    "ExecutorLoad",
    "ExecutorPort",
    "LeaseGrant",
    "Priority",
    "Request",
    "RequestStatus",
    "RequestUpdate",
    "SchedulerConfig",
    "SchedulerCore",
    "StepUpdates",
    "UpdateSink",
]
