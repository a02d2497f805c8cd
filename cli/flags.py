"""The library names a setting as it calls it (max_tokens); the CLI writes the flag
that sets it (--max-tokens) wherever a message names one."""

import re

from entropix_mlx.errors import EntropixError

FLAGS = {"overwrite": "--force", "split": "--split", "builtin": "--builtin"}


def with_flags(error: EntropixError) -> str:
    """The error's message with each setting it names as the CLI's flag for it."""
    return flagged(str(error), error.settings)


def flagged(message: str, settings) -> str:
    """`message` with each of `settings` it names written as the CLI's flag for it."""
    for setting in settings:
        flag = FLAGS.get(setting, "--" + setting.replace("_", "-"))
        message = re.sub(rf"(?<![\w-]){re.escape(setting)}(?![\w-])", flag, message)
    return message
