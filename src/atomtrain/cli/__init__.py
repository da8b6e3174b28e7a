"""Thin command-line layer: parse, call the library, return an exit code."""
