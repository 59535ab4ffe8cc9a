"""The executor core: loads a model, holds the KV pool, runs step plans. No gRPC here."""
