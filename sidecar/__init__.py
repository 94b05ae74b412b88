"""tool-retry-sidecar: retries, waits for and repairs failed HTTP tool calls."""

__version__ = "0.6.0"
