"""Model construction: the portable layer spec, built-in presets, value heads."""
