"""Inversion probes: hidden-state capture and decoders trained on frozen embeddings."""
