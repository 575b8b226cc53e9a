"""The sandboxed impl runner, the only process that runs code a job brings
(`python -m kassay.worker.runner.main`), and the sandbox launcher that confines it
(`python -m kassay.worker.runner.sandbox`). Standard library only in `sandbox`."""
