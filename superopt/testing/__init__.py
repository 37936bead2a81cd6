"""Shared test fixtures: the declarative op table and the light-model loader."""
