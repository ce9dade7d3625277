"""How a kernel gets from an upstream into the store, stage by stage.

    hardware     what this host has (CPU, GPUs, drivers): the platforms prefetch plans for
    upstreams    the configured upstreams in order (Hub, mirrors), each tracked for status
    request      what a caller asks for (KernelSpec) and what resolving it answers
    resolve      a repo and revision -> a commit -> the variants it has (refs and listings)
    fetch        a variant's files from the upstreams into the store, each blob verified
    provenance   who published the commit (signatures, attestations), recorded with the tree
    acquire      the one path from a name to a tree: denies, refs, listings, trust, hold,
                 lookup, fetch, dependencies, by a plan (plans.py: Best, Listed, Named)
    prefetch     the variants a host's platforms need, acquired ahead of any job

Every caller drives these stages through `Acquire` (`acquire.py`): the daemon's front ends with
its gate (`kerneld.server.services.gate`: bounds, publisher trust, the fetch history), store tools
(`kerneldctl prefetch --store`, `Resolver.resolve`) with the allow-all gate.
"""
