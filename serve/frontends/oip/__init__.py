"""The Open Inference Protocol (KServe v2): REST and gRPC frontends."""
