"""Subcommands of the ``dsa-ops`` console script; one module each (add_arguments, run, HELP)."""
