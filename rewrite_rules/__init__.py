"""rewrite_rules."""
