"""Planner: cost model (cost_model.py) and tier/K/d/KV choice (planner.py)."""
