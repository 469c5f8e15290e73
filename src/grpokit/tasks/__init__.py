"""grpokit.tasks"""
