"""torchcal.report (under construction)."""
