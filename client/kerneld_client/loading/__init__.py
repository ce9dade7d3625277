"""How `get_kernel` loads a kernel, one stage per module (the public API is `loader`).

    request    context.py      the selector checked, the caller's options, the dependency stack
    sources    sources.py      the `Source` protocol and the `Candidate` a source finds:
               local.py        a `LOCAL_KERNELS` override (the caller's own folder)
               published.py    the daemon's published index (the warm path: no RPC)
               daemon.py       the daemon over gRPC, one cold ask per kernel per host (_coalesce)
               hub.py          the `hub` fallback: a verified download into this user's cache
    materialize materialize.py lock -> trust -> verify -> device check -> dependencies -> import
    pipeline   pipeline.py     the sources in order, each candidate through materialize
    call       call.py         the memo, one flight per kernel (SingleFlight), then the fallback
    fallback   fallback.py     what a failure becomes: the caller's object, the Hub, or the error

A warm hit never comes here: `kerneld_client.get_kernel` tries the warm fast path (`_warm`)
first, and these stages load what it hands over (a miss, or any doubt). Even then the local,
daemon, hub and fallback stages are imported only when a load needs them, so a process whose
kernels are all in the index never imports grpc or huggingface_hub.
"""
