"""Objectives and curricula (schedules over objectives)."""
