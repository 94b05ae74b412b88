"""The bundled demo: a flaky weather tool, a sidecar in front of it, a scripted agent."""
