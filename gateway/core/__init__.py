"""The gateway's domain logic: tokenization, detokenization, stop strings, OpenAI shapes, rate limits.

Nothing here imports grpc or generated stubs; the gateway server converts at its edge.
"""
