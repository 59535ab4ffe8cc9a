"""radixmesh: structured LLM inference as a gRPC microservice mesh."""

__version__ = "0.1.0"
