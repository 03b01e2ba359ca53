"""torchcal.data (under construction)."""
