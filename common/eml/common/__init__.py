"""Shared code of the tutorial: reference checks (checks), timing (timing), the tour (tour)."""
