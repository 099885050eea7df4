"""The hybrid index: the Qdrant Edge (embedded) and Qdrant server backends, their shared helpers, the BM25
sparse encoder, and the lease that lets processes share an embedded index."""
