"""The in-process engine: scheduler, cache and executor cores wired together without gRPC."""

from mesh.engine.engine import Completion, Engine, EngineConfig, RequestStream

__all__ = ["Completion", "Engine", "EngineConfig", "RequestStream"]
