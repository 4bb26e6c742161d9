"""The shipped experiment configs (YAML; every one is loaded by a test).

This folder installs as ``memlab.configs`` (package data), so an installed wheel
carries them; :func:`memlab.paths.shipped_config` finds one by name.
"""
