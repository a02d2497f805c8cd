"""Errors a user can provoke. Each carries a one-line message that says what is
wrong and what to do; the CLI prints it and exits with code 2."""


class EntropixError(Exception):
    """Base class: a problem with the user's input, not a bug. `settings`: the
    settings the message names (as the library calls them, e.g. max_tokens), so
    that an interface can name its own way of setting them (the CLI's flags)."""

    def __init__(self, message: str = "", settings: tuple[str, ...] = ()):
        super().__init__(message)
        self.settings = tuple(settings)


class ModelLoadError(EntropixError):
    """The model reference cannot be resolved or its files cannot be read."""


class UnsupportedModelError(ModelLoadError):
    """The files are readable but describe a model this port does not run."""


class ContextOverflowError(EntropixError):
    """The cache would grow past the model's context length."""


class ConfigError(EntropixError):
    """A sampler or CLI setting is invalid."""


class DistributedError(EntropixError):
    """The ranks of a launched job cannot work together: one did not connect,
    one went away, or they were given different models or settings."""


class FollowerExit(EntropixError):
    """A rank other than 0 stops because rank 0 stopped with an error that rank 0
    prints: printing it on every rank would only repeat it."""
