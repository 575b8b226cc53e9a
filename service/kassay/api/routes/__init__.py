"""The API's routers: jobs (submit, list, get, report, events, cancel), workers, health and
metrics, and the dashboard page."""
