"""Training: data (datasets, chat templates, loss masks, packing), the trainer loop, LoRA,
optimizers, checkpoints and metrics. Subpackages import what they need; importing this one
loads nothing heavy.
"""
