"""superopt."""
