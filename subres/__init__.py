"""subres: an aggregated API server that gives CRD objects console, vnc, screenshot and portforward subresources."""
