"""Plain-function forms of torchcal's losses (the ``nn.Module`` losses call these)."""
