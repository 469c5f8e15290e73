"""grpokit.record"""
