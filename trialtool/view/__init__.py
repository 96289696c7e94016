"""The graders' view: read trials, never change them (status, show, report, export)."""
