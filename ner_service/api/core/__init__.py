"""Cross-cutting parts of the API: security, micro-batching, the model registry, metrics and logging."""
