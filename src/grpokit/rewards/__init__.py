"""grpokit.rewards"""
