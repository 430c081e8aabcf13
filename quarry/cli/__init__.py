"""The ``quarry`` command line (``quarry.cli.root``: the app; one module per command group).

Every command runs through one handler (:class:`~quarry.cli.root._OneErrorLine`): Quarry's errors and invalid
``QUARRY_*`` settings print one ``error (Type): message`` line and exit 2, from the ``quarry``
console script and ``python -m quarry.cli`` alike.
"""

from quarry.cli.root import app, main, settings_error, stored_error

__all__ = ["app", "main", "settings_error", "stored_error"]
