"""Command-line interface: ``aiayn COMMAND`` (see :mod:`aiayn.cli.main`)."""
