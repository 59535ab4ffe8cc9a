"""The contract: generated gRPC stubs (`radixmesh.v1`) and the plain types every room shares.

The ground floor of the house. Everything here is plain Python over protobuf: no
module imports grpc, a service, the gateway, the kernels or the top floor (`mesh`).

    sampling     sampling parameters, constraints and priority classes, validated once
    step         the step plan and result (scheduler <-> executor)
    cache_types  lease, commit and pool results (scheduler <-> cache)
    result_key   the result cache's key for a request
    errors       the exceptions cores raise; the runtime maps each to one status code
    wire         protobuf <-> these types, one converter per concept
"""

__version__ = "0.1.0"
