"""Objectives and curricula (schedules over objectives).

Importing this package registers the objectives (``OBJECTIVES``: next_token, copy, blank_copy,
causal_lm, combined) and the curricula (``CURRICULA``: phases, blank_copy_then_next_token).
"""

from memlab.curricula import objectives, schedules  # noqa: F401
from memlab.curricula.objectives import Objective, evaluate_objectives, make_objective  # noqa: F401
from memlab.curricula.schedules import Phase, PhaseSchedule  # noqa: F401
