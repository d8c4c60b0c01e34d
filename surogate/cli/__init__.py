"""The `surogate` command line: `main.py` builds the typer app, one file per command.

Commands import their heavy parts (the TUI, the gateway, the native engine) inside the command
body, so `surogate --help` and `import surogate.cli.main` stay cheap.
"""
