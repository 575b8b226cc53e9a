"""The executor process (`python -m kassay.worker.executor.main`): the trusted child that owns
the device, makes inputs and float64 references, runs built-in impls and judges every output
(`main`), and its side of the code a job brings, run apart in a sandboxed runner
(`remote_impls`)."""
