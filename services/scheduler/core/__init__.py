"""The scheduler core: no gRPC, talks to the cache and executors through ports."""

from services.scheduler.core.config import SchedulerConfig, fit_to_executors
from services.scheduler.core.executor_state import ExecutorLoad
from services.scheduler.core.ports import CachePort, ExecutorPort
from services.scheduler.core.request import Request, RequestStatus, StepUpdates
from services.scheduler.core.scheduler import SchedulerCore, UpdateSink

__all__ = [
    "CachePort",
    "ExecutorLoad",
    "ExecutorPort",
    "Request",
    "RequestStatus",
    "SchedulerConfig",
    "SchedulerCore",
    "StepUpdates",
    "UpdateSink",
    "fit_to_executors",
]
