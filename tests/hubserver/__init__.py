"""The Hub-compatible test server, seen by a plain HTTP client: routes, headers, errors, Range,
pagination, counters and every fault kind. The client tests rely on all of this being right."""
