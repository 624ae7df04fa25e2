"""Ray actor pools and the value-only worker ABI (imports Ray)."""
