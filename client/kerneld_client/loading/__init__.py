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

The warm path imports only `call`, `context`, `loaded`, `sources`, `published`, `materialize`
and `pipeline` (every module costs a process about 0.1 ms to import); the local, daemon, hub
and fallback stages are imported when a load needs them, so a process whose kernels are all in
the index never imports grpc or huggingface_hub.
"""
