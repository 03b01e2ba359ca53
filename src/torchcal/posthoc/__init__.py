"""torchcal.posthoc (under construction)."""
