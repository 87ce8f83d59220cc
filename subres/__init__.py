"""subres: an aggregated API server giving CRD objects console, vnc and portforward."""
