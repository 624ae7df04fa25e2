"""The systems under test, one runner each, and what they share."""
