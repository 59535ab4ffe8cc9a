"""The shared gRPC runtime: server lifecycle, health, the error interceptor, logs, metrics."""
