"""What a binding raises when its framework does not import: what to install, and why not."""

from __future__ import annotations


def missing_framework(
    binding: str, framework: str, package: str, error: ImportError
) -> ImportError:
    """The ImportError for `binding` (raise it `from error`).

    It keeps the original's class (ModuleNotFoundError where the framework is not installed) and
    module name, so callers that catch either still do; the original's message stays in the text
    too, since an installed framework that fails to import (a missing shared library, say) needs
    more than the install command.
    """
    cls = ModuleNotFoundError if isinstance(error, ModuleNotFoundError) else ImportError
    return cls(
        f"{binding} needs {framework}: pip install {package} (or pip install "
        f"'raggedattn[{package}]'); importing it failed: {error}",
        name=error.name,
    )
