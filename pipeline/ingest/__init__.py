"""Pages to evidence: the page schema, the storage-format parser, evidence extraction, contextualization,
redaction, and the ingest run."""
