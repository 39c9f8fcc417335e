"""``python -m gateway.cli``: the ``rmgate`` command."""

from gateway.cli.main import main

main()
