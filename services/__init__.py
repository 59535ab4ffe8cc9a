"""The mesh's services: cache, scheduler and executor, and their shared runtime."""
