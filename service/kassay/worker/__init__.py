"""The worker, split by process: `server/` (the gRPC server and the supervisor, one process),
`executor/` (the trusted child that owns the device), `runner/` (the sandboxed runner of code a
job brings, and its sandbox); `exchange/` (tensors between the executor and the runner) and
`frames.py` (length-prefixed JSON over a child's pipes) are what two of them share."""
