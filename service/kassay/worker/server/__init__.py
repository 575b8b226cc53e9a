"""The worker process: the gRPC server (`service`), who may call it (`access`), its error
mapping (`interceptor`) and metrics, and the supervisor with what it holds: the executor child
(`executor_process`), the group on it (`active_group`), the sandboxed runners it lends
(`runner_leases`) and the artifact cache (`artifact_cache`)."""
