"""The HTTP API: health, status, events and the operator's controls."""
