"""The installed version of trialtool, read by the package, the servers and the build."""

__version__ = "0.2.0"
