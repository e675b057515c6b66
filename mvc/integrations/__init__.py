"""Training-loop integrations: the `Tracker` that commits checkpoints while a model trains."""
from mvc.integrations.tracker import Tracker, TrackerError, clone_to_cpu

__all__ = ["Tracker", "TrackerError", "clone_to_cpu"]
