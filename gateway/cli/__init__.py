"""``rmgate``, the command line: ``main`` (serve, demo, scale, check...), ``ledger``."""
