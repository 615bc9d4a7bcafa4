"""Developer tools that ship with dsa-ops (builds and probes run by hand, not by the library)."""
