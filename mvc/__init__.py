"""mvc: git-like version control for deep-learning training checkpoints."""
from mvc.errors import DataError, InternalError, MvcError, UsageError

__version__ = "0.1.0"

__all__ = ["MvcError", "DataError", "InternalError", "UsageError", "__version__"]
