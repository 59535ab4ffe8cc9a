"""The edge of the mesh: OpenAI-compatible HTTP and the public gRPC API in front of the scheduler."""
