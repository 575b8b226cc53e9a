"""How tensors cross between the trusted executor and the sandboxed impl runner: one interface
(`transports`) over CUDA IPC (`cuda_ipc`) or raw files (`tensor_files`)."""
