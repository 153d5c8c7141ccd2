"""Training feature heads for a target (``verispec train-head``): prompts.py (the prompts, generated here),
distill.py (the target answers them; its states are recorded), train.py (the loss with EAGLE-3's training-time
test, held-out metrics, checkpoints and resume)."""
from .train import TrainConfig, train_head

__all__ = ["TrainConfig", "train_head"]
