"""The static mirror format: what `kerneldctl mirror export` writes and mirror upstreams read."""
