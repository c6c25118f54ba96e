"""Running the gateway: the supervisor of `serve --workers`, liveness and readiness for load
balancers, and the metrics a process counts."""
