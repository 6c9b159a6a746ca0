"""Process-wide caches the services share: what never changes after submission, and verified tokens."""
