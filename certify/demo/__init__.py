"""Bundled demo models trained on certify's synthetic traffic signs (see scripts/train_demo.py)."""
