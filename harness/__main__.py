"""`python -m harness ...`: see harness.cli."""

from harness.cli import entry

entry()
