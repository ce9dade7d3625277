"""The daemon's HTTP front: accept loop, identity at accept, h11 parsing, per-uid shares."""
