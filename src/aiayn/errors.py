"""Errors that mean "the user's input is wrong": the CLI prints them without a traceback."""


class UserError(ValueError):
    """Bad user input (a config value, a file, an argument); the message names the bad value."""


class ConfigError(UserError):
    """An unknown or invalid configuration key or value."""


class LengthError(UserError):
    """An input with more tokens than a limit allows (a model's positions, a drawing's size).

    Attributes:
        tokens: the input's tokens.
        limit: the most the limit allows.
    """

    def __init__(self, message: str, *, tokens: int, limit: int):
        super().__init__(message)
        self.tokens, self.limit = tokens, limit
