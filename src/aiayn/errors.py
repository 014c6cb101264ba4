"""Errors that mean "the user's input is wrong": the CLI prints them without a traceback."""


class UserError(ValueError):
    """Bad user input (a config value, a file, an argument); the message names the bad value."""


class ConfigError(UserError):
    """An unknown or invalid configuration key or value."""
