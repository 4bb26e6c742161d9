"""Data: corpus -> documents -> sentences -> tokens -> chunks."""
