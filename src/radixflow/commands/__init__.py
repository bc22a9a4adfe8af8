"""CLI subcommands; shared flag definitions live in `common`."""
