"""The program runtime's core: no grpc, no generated stubs."""
