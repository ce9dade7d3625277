"""Where kernel bytes come from: the Hugging Face Hub, mirror directories and HTTP mirrors.

Every upstream answers the same small set of questions (refs, commit of a revision, variants of
a commit, files of a variant with their upstream digests, the bytes of one file). The store
verifies every byte against those digests; upstreams are never trusted for content.
"""
