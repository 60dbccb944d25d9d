"""A vLLM-0.33-compatible simulator: the same CLI, endpoints and /metrics, driven by a profile file."""
