"""torchcal.models (under construction)."""
