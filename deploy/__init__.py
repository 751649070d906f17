"""Deployment: a local multi-host cluster in network namespaces (`local/`) and manifests."""
