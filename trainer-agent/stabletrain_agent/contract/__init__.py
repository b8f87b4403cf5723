"""Torch-free schemas where the agent and the operator meet.

The operator imports them; the agent never imports the operator.
"""
