"""The package version, in one place (imported by the package and its instruments)."""

__version__ = "1.0.0rc1"
