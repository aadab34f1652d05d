"""Vision Transformer model, data, training engine, checkpoints and logging."""
