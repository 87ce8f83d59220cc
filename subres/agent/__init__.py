"""`subres agent`: the node-local relay replicas reach over mutual TLS (DaemonSet, one per node)."""
