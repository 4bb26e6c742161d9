"""Analyses over trained runs and analytic models: inference FLOPs against sequence length
(:mod:`memlab.analysis.flops_model`) and scaling-law fits over model-size sweeps
(:mod:`memlab.analysis.scaling`)."""
