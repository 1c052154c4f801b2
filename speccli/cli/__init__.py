"""The Typer command line: options -> request objects -> the commands; errors -> one line."""
