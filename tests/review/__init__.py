"""Adversarial review of the issue-13 lease calls and pool check: tests that fail on the defects found."""
