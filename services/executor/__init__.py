"""The executor service: weights, the KV tensors, the forward pass and sampling."""
