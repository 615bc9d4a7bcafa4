"""Compile-pipeline passes for dsa_ops (the decode backend rewrite lives here)."""
