"""The cache service: KV page pools, the radix tree of cached prefixes, leases, result and session stores."""
