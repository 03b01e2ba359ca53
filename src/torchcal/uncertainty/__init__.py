"""torchcal.uncertainty (under construction)."""
