"""White-box inversion: recover a model's input from its states, with the model's own weights."""
