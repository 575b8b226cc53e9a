"""Generated protobuf/gRPC stubs of the kassay.v1 worker contract (protos/kassay/v1/).

Never edit by hand: run `make protos` (python -m kassay.worker.protogen).
"""
