"""How a kernel gets from an upstream into the store, stage by stage.

    hardware     what this host has (CPU, GPUs, drivers): the platforms prefetch plans for
    upstreams    the configured upstreams in order (Hub, mirrors), each tracked for status
    resolve      a repo and revision -> a commit -> the variants it has -> the one to use
    fetch        a variant's files from the upstreams into the store, each blob verified
    provenance   who published the commit (signatures, attestations), recorded with the tree
    prefetch     the variants a host's platforms need, resolved and fetched ahead of any job

The daemon's front ends (`kerneld.server`) drive these stages through `Acquire`, the one gate
where bounds, deny rules and publisher trust are applied; store tools (`kerneldctl --store`)
use them directly.
"""
