"""Serving the agents: the process, the app's assembly, the proxy handler and its answers."""
