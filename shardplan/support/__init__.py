"""Plumbing every layer shares: the error type, input limits, overflow guards, name matching,
bounded file reading, atomic writes and optional-extra checks."""
