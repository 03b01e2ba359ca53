"""torchcal.train (under construction)."""
