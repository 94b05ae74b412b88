"""Payload repair: schema coercion, the tool's own suggestions, then an LLM — in that order."""
