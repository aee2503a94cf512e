"""Whether this process can serve: readiness of the model, Redis and the database (/healthz),
and its Prometheus metrics (/metrics)."""
