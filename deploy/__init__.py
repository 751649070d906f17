"""Deployment: a local multi-host cluster in network namespaces (`local/`), compose and Kubernetes manifests."""
