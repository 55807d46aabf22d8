"""Planner: cost model (cost_model.py), the placement for a budget and its acceptance (layout.py), the smallest
budget a refusal names (budget.py), and the plan (planner.py)."""
