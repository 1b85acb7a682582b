"""The ``memplan`` command line (typer); see docs/cli.md.

Entry point: :func:`memplan.cli.app.main`.
"""
