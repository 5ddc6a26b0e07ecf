"""Cross-cutting parts of the API: security, micro-batching, metrics and logging."""
