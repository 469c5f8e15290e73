"""Optimizers (optimizers.py) and learning-rate schedules (schedule.py) built from the config's optim
section: pure torch, no trainer state. Below train/ and validation/ in the layers
(tests/project/test_layering.py), so validation checks optimizer and schedule names without importing
the trainer."""
