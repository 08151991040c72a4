"""The package's version: a leaf module, so code below the package face can read it."""

__version__ = "0.1.0"
