"""``tool-retry-sidecar inject``: Kubernetes manifests in, with the sidecar added out."""
