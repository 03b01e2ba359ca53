"""torchcal.metrics (under construction)."""
