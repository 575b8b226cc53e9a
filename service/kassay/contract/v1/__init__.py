"""Generated protobuf/gRPC stubs of the kassay.v1 worker contract
(protos/kassay/contract/v1/; the proto package, and so the gRPC service names, stay kassay.v1).

Never edit by hand: run `make protos` (python -m kassay.contract.protogen).
"""
