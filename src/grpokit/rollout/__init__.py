"""grpokit.rollout"""
