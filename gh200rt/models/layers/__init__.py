"""Building blocks shared by the model families: linear through a WeightRef, RMSNorm, RoPE, SiLU-gated MLP, attention."""
