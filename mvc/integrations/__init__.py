"""Training-loop integrations: the `Tracker` that commits checkpoints while a model trains, and
its reusable parts (`GradientEMA`) for framework callbacks."""
from mvc.integrations.commit_process import CommitProcessError
from mvc.integrations.grad_ema import GradientEMA, GradientEMAError
from mvc.integrations.tracker import Tracker, TrackerError, clone_to_cpu

__all__ = ["CommitProcessError", "GradientEMA", "GradientEMAError", "Tracker", "TrackerError", "clone_to_cpu"]
