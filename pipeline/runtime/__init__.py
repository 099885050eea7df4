"""Process plumbing: settings, the factory that builds every client, metrics, log context, retries,
user-facing error text."""
