"""The process and its services: the one model runtime, rate limits, the fail-fast Redis client,
metrics, system checks, and the latency report with the project's one percentile."""
