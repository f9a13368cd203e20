"""Exception classes shared by every part of the platform.

Every error a user can cause (bad configuration, bad input file, missing
prerequisite) is a :class:`CxlssdError`: the CLI prints its message on one line
and exits with :attr:`CxlssdError.exit_code`, never with a traceback.
"""


class CxlssdError(Exception):
    """Base class of the platform's expected errors: message names problem and fix."""

    exit_code = 2


class ConfigError(CxlssdError):
    """A configuration file, profile or override is malformed or impossible."""


class InputError(CxlssdError):
    """An input file (trace, experiment, ...) is missing, truncated or of the wrong version."""


class PrerequisiteError(CxlssdError):
    """Something the platform needs on the host is missing or unusable."""


class GuestError(CxlssdError):
    """The guest did not come up, or a command in it failed to run."""


class GuestTimeout(GuestError):
    """A guest command or boot step did not finish within its deadline (a hung guest)."""


class PlacementError(GuestError):
    """The guest could not put a node's free memory in its fixed order (a block in use)."""


class FirmwareError(CxlssdError):
    """The firmware process failed, died, or the plugin gave up on it."""


class ClusterError(CxlssdError):
    """The Ray cluster is unreachable or unfit for the points, or lost a point's worker
    more often than a point is retried."""
