"""Generated Python stubs of `protos/radixmesh/v1` (regenerate with `radixmesh gen-protos`)."""
