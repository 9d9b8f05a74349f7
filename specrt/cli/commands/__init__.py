"""CLI commands, grouped by issue area; each module adds its commands to `specrt.cli.main.main`."""
